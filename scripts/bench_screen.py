"""The screen against the replay: does the two-tier predictor hide the winner?

For every landscape of scripts/bench_tuner.py (the space, GPU, workload and load its
studies use, the harsh bench's SLOs) and, with ``--plan-gpus``, the README plan's space
on each GPU kind of the catalog, this replays the whole lattice (the baseline: what the
warm start did before the screen) and screens it (``SimOracle.screen``), then prints:

- the screen's seconds against the replay's (ratio), per config;
- Spearman's rank correlation of the screen's objective value against the replay's on a
  random sample of ``--sample`` configs (a predicted failure counts as 0);
- where the replay's best over the whole lattice falls in the screen's ranking
  (``two_tier.screen_rank``) and whether it is inside the short list
  (``two_tier.shortlist_size``: 2% of the lattice);
- how many configs the two tiers replay (the short list, doubled while its replays do not
  bear the screen out: ``two_tier.trusted``) and the two-tier optimum (the replay's best
  over them) as a share of the whole-lattice replay optimum.

    python scripts/bench_screen.py [--landscape NAME ...] [--plan-gpus] [--sample 300]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_tuner import LANDSCAPES, prepare  # noqa: E402

from autotune.trial.prescreen import make_prescreen  # noqa: E402
from autotune.tuner.forked import default_workers  # noqa: E402
from autotune.tuner.kv_bounds import largest_kv_pool_bytes, shaped  # noqa: E402
from autotune.tuner.lattice import enumerate_effective  # noqa: E402
from autotune.tuner.predictor import SimOracle, predict_all  # noqa: E402
from autotune.tuner.two_tier import screen_rank, shortlist_size, trusted  # noqa: E402

PLAN_GPUS = ("rtx4090-24g", "l40s-48g", "a100-80g", "h100-80g", "h200-141g")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho (ties at their mean rank), as pandas computes it."""
    return float(pd.Series(a).corr(pd.Series(b), method="spearman"))


def value(scored) -> float:
    """The objective value when feasible, else 0."""
    return scored.values[0] if scored is not None and scored.feasible and scored.values else 0.0


def measure(name: str, spec, oracle: SimOracle, sample: int, space=None, prescreen=None) -> dict:
    candidates = [
        c
        for c in enumerate_effective(
            space or spec.space,
            model=spec.model,
            engine_version=spec.engine.version(),
            prescreen=prescreen or spec.prescreen,
            workers=default_workers(),
        )
        if c.memory is None or c.memory.fits
    ]
    configs = [c.config for c in candidates]
    started = time.monotonic()
    screened = oracle.screen(configs)
    screen_s = time.monotonic() - started
    started = time.monotonic()
    replayed = predict_all(oracle, configs)
    replay_s = time.monotonic() - started
    replay_values = np.array([value(s) for s in replayed])
    screen_values = np.array([value(s) for s in screened])
    rng = np.random.default_rng(0)
    picked = rng.choice(len(configs), size=min(sample, len(configs)), replace=False)
    rho = spearman(screen_values[picked], replay_values[picked])
    order = screen_rank(screened, maximize=True)
    best = int(np.argmax(replay_values))
    rank = int(np.flatnonzero(order == best)[0]) + 1
    short = shortlist_size(len(configs))
    taken = 0  # the two tiers' doubling short list (two_tier.predict_two_tier)
    while taken < len(order):
        taken += short if taken == 0 else taken
        head = order[:taken]
        if trusted([screened[i] for i in head], [replayed[i] for i in head]):
            break
    taken = min(taken, len(order))
    two_tier = replay_values[order[:taken]].max()
    return {
        "name": name,
        "configs": len(configs),
        "screen_ms": 1e3 * screen_s / len(configs),
        "replay_ms": 1e3 * replay_s / len(configs),
        "rho": rho,
        "rank": rank,
        "short": short,
        "replayed": taken,
        "share": two_tier / replay_values[best] if replay_values[best] > 0 else float("nan"),
    }


def on_gpu(spec, gpu: str):
    """The study's space for ``gpu`` as ``compare --what-if`` and ``plan`` tune it: the KV
    range scaled to the card, its pre-screen, an oracle on it."""
    plan = spec.oracle.plan
    longest = max((request.prompt_tokens for request in plan.requests), default=0)
    prescreen = make_prescreen(hardware=gpu, sim_model=spec.model, max_prompt_tokens=longest)
    space = spec.space
    largest = largest_kv_pool_bytes(
        space, model=spec.model, engine_version=spec.engine.version(), prescreen=prescreen
    )
    if largest is not None:
        space = shaped(space, largest)
    oracle = SimOracle(
        hardware=gpu, sim_model=spec.model, plan=plan, load=spec.oracle.load, goal=spec.oracle.goal
    )
    return space, prescreen, oracle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscape", action="append", choices=sorted(LANDSCAPES))
    parser.add_argument("--plan-gpus", action="store_true", help="also the plan's GPU kinds")
    parser.add_argument("--sample", type=int, default=300)
    args = parser.parse_args()
    rows = []
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.landscape or list(LANDSCAPES):
            spec = prepare(LANDSCAPES[name], Path(scratch), harsh=True)["spec"]
            rows.append(measure(name, spec, spec.oracle, args.sample))
            print(rows[-1], flush=True)
        if args.plan_gpus:
            base = prepare(LANDSCAPES["readme"], Path(scratch), harsh=True)["spec"]
            for gpu in PLAN_GPUS:
                space, prescreen, oracle = on_gpu(base, gpu)
                row = measure(f"README space on {gpu}", base, oracle, args.sample, space, prescreen)
                rows.append(row)
                print(row, flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print()
    print(
        "| landscape | configs | screen ms/config | replay ms/config | ratio | Spearman "
        "(sample) | replay's best: screen rank | short list | inside | replayed (doubling) | "
        "two-tier optimum |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for row in rows:
        inside = "yes" if row["rank"] <= row["short"] else "**no**"
        print(
            f"| {row['name']} | {row['configs']:,} | {row['screen_ms']:.2f} | "
            f"{row['replay_ms']:.1f} | {row['replay_ms'] / row['screen_ms']:.0f}x | "
            f"{row['rho']:.2f} | {row['rank']} | {row['short']} | {inside} | "
            f"{row['replayed']:,} | {100 * row['share']:.1f}% |"
        )


if __name__ == "__main__":
    main()
