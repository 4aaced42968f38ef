"""How long `autotune plan` takes: the README's plan (4 GPU kinds x TP 1, 2), per GPU
kind and TP size, against the `compare --what-if` tuning of the same GPU and TP (one warm
start at the full load, no sizing), in one run so the host's load cancels out in the ratio.

Ours per candidate: the space tuned at one replica's share (twice when the first sizing
gives more than one replica), the fewest replicas found by predicting the fleet side by
side, the headroom.

    python scripts/bench_plan.py [--workload team.jsonl] [--predictions 12]
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.catalog.prices import default_prices
from autotune.cli.plan import DEFAULT_GPUS, DEFAULT_PREDICTIONS, target_load
from autotune.config.known_flags import VLLM_FLAGS_VERSION
from autotune.config.space import default_space_path, load_space
from autotune.fleet.candidates import PlanInputs, plan_gpu, space_with_tp
from autotune.results.what_if import tune_space
from autotune.trial.objective import Goal, ObjectiveName, parse_slos
from autotune.workload.expand import load_plan

MODEL = "qwen3.6-27b-awq"
SESSIONS = 40
SLO = "ttft_p95<=3s"
TP_SIZES = (1, 2)
README_GEN = ["claudecode", "--sessions", "48", "--requests-per-session", "10", "--seed", "1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, help="default: the README's team.jsonl")
    parser.add_argument("--predictions", type=int, default=DEFAULT_PREDICTIONS)
    args = parser.parse_args()
    workload = args.workload
    if workload is None:
        workload = Path(tempfile.mkdtemp()) / "team.jsonl"
        subprocess.run(
            [sys.executable, "-m", "autotune", "workload", "gen", *README_GEN, str(workload)],
            check=True, capture_output=True,
        )  # fmt: skip
    plan = load_plan(workload)
    load = target_load(plan, SESSIONS, None, None)
    goal = Goal(objectives=[ObjectiveName.THROUGHPUT], slos=parse_slos([SLO]))
    inputs = PlanInputs(
        plan=plan, load=load, goal=goal, space=load_space(default_space_path(MODEL)),
        model=MODEL, sim_model=MODEL, engine_version=VLLM_FLAGS_VERSION,
        max_predictions=args.predictions,
    )  # fmt: skip
    print(
        f"{plan.name}: {len(plan.requests)} requests, {len(plan.sessions)} sessions; "
        f"{SESSIONS} sessions at once, {SLO}; {args.predictions} predictions per tuning"
    )
    print("| GPU | TP | plan s | what-if tuning s | ratio | replicas | $/hour |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    totals = [0.0, 0.0]
    winners = []
    for gpu, tp in itertools.product(DEFAULT_GPUS, TP_SIZES):
        started = time.monotonic()
        candidate = plan_gpu(
            inputs, gpu, default_prices()[gpu], lambda _: None, tp=tp, others=winners
        )
        winners += [candidate.config] if candidate.config else []
        ours = time.monotonic() - started
        started = time.monotonic()
        tune_space(
            space_with_tp(inputs.space, tp), gpu=gpu, model=MODEL, sim_model=MODEL,
            engine_version=VLLM_FLAGS_VERSION, goal=goal, maximize=True, plan=plan, load=load,
            max_predictions=args.predictions,
        )  # fmt: skip
        what_if = time.monotonic() - started
        totals[0] += ours
        totals[1] += what_if
        cost = "-" if candidate.usd_per_hour is None else f"{candidate.usd_per_hour:.2f}"
        print(f"| {gpu} | {tp} | {ours:.0f} | {what_if:.0f} | {ours / what_if:.1f}x | "
              f"{candidate.replicas or 'none meets'} | {cost} |")  # fmt: skip
    count = len(DEFAULT_GPUS) * len(TP_SIZES)
    ratio = totals[0] / totals[1]
    print(f"| all {count} | | {totals[0]:.0f} | {totals[1]:.0f} | {ratio:.1f}x | | |")


if __name__ == "__main__":
    main()
