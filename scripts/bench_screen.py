"""The two tiers against the whole-lattice replay: does the screen hide the winner?

For every landscape of scripts/bench_tuner.py (the space, GPU, workload and load its
studies use, the harsh bench's SLOs) and, with ``--plan-gpus``, the README plan's space
on each GPU kind of the catalog, this predicts the whole lattice in two ways:

- the baseline, the warm start before the screen: every config replayed
  (``predict_all``, worker processes);
- the two tiers (``two_tier.predict_two_tier``, as the warm start, ``compare --what-if``
  and ``plan`` run them): every config screened, the short list and the climb replayed;

and prints, per lattice: the screen's milliseconds a config; Spearman's rank correlation
of the screen's objective value with the replay's on a random sample of ``--sample``
configs (a predicted failure counts as 0); where the replay's best over the whole lattice
falls in the screen's ranking, and whether it is among the short list's configs (2% of
the lattice in distinct screen predictions) and among those the two tiers replay; the
two-tier optimum as a share of the whole-lattice one; the configs each way replays and
its seconds, as a ratio. Each way starts with the process's replays forgotten.

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

from autotune.sim.virtual.predict import process_shared_runs  # noqa: E402
from autotune.trial.prescreen import make_prescreen  # noqa: E402
from autotune.tuner.kv_bounds import largest_kv_pool_bytes, shaped  # noqa: E402
from autotune.tuner.lattice import enumerate_effective  # noqa: E402
from autotune.tuner.predictor import SimOracle, predict_all  # noqa: E402
from autotune.tuner.two_tier import (  # noqa: E402
    predict_two_tier,
    screen_rank,
    shortlist,
    shortlist_size,
)

PLAN_GPUS = ("rtx4090-24g", "l40s-48g", "a100-80g", "h100-80g", "h200-141g")


def value(scored) -> float:
    """The objective value when feasible, else 0."""
    return scored.values[0] if scored is not None and scored.feasible and scored.values else 0.0


def forget_replays() -> None:
    """Start a way of predicting with none of this process's replays kept."""
    process_shared_runs.cache_clear()


def measure(name: str, spec, oracle: SimOracle, sample: int, space=None, prescreen=None) -> dict:
    candidates = [
        c
        for c in enumerate_effective(
            space or spec.space,
            model=spec.model,
            engine_version=spec.engine.version(),
            prescreen=prescreen or spec.prescreen,
        )
        if c.memory is None or c.memory.fits
    ]
    configs = [c.config for c in candidates]
    forget_replays()
    started = time.monotonic()
    cache: dict = {}
    tiers = predict_two_tier(oracle, candidates, cache, maximize=True)
    two_tier_s = time.monotonic() - started
    started = time.monotonic()
    screened = oracle.screen(configs)
    screen_s = time.monotonic() - started
    forget_replays()
    started = time.monotonic()
    replayed = predict_all(oracle, configs)
    replay_s = time.monotonic() - started
    replay_values = np.array([value(s) for s in replayed])
    screen_values = np.array([value(s) for s in screened])
    picked = np.random.default_rng(0).choice(
        len(configs), size=min(sample, len(configs)), replace=False
    )
    rho = float(
        pd.Series(screen_values[picked]).corr(pd.Series(replay_values[picked]), method="spearman")
    )
    best = int(np.argmax(replay_values))
    rank = int(np.flatnonzero(screen_rank(screened, maximize=True) == best)[0]) + 1
    listed = [i for group in shortlist(screened, True, shortlist_size(len(configs))) for i in group]
    judged = [i for i, c in enumerate(candidates) if c.key in cache]
    two_tier_best = max((replay_values[i] for i in judged), default=0.0)
    return {
        "name": name,
        "configs": len(configs),
        "screen_ms": 1e3 * screen_s / len(configs),
        "rho": rho,
        "rank": rank,
        "distinct": shortlist_size(len(configs)),
        "listed": len(listed),
        "in_list": best in listed,
        "in_judged": best in judged,
        "share": two_tier_best / replay_values[best] if replay_values[best] > 0 else float("nan"),
        "judged": len(judged),
        "climbed": tiers.climbed,
        "two_tier_s": two_tier_s,
        "replay_s": replay_s,
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
        "| landscape | configs | screen ms/config | Spearman (sample) | replay's best: screen "
        "rank | short list (distinct / configs) | best in it | best replayed | two-tier "
        "optimum | replayed: two tiers / whole | seconds: two tiers / whole | ratio |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        yes = {True: "yes", False: "**no**"}
        print(
            f"| {row['name']} | {row['configs']:,} | {row['screen_ms']:.2f} | {row['rho']:.2f} | "
            f"{row['rank']} | {row['distinct']} / {row['listed']} | "
            f"{yes[row['in_list']]} | {yes[row['in_judged']]} | "
            f"{100 * row['share']:.2f}% | {row['judged']:,} / {row['configs']:,} | "
            f"{row['two_tier_s']:.1f} / {row['replay_s']:.1f} | "
            f"{row['replay_s'] / max(row['two_tier_s'], 1e-9):.1f}x |"
        )


if __name__ == "__main__":
    main()
