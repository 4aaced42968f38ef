"""Search strategies on the simulator: how close N trials get to the exhaustive optimum.

Each trial is the simulator's in-process prediction (no HTTP), scored with the
same space, pre-screen and objective code the study uses. The exhaustive
optimum comes from a grid over the same space; the baselines are random search
and the space's hand-tuned baseline config.

    python scripts/bench_search.py [--trials 20] [--seeds 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import statistics
import time
from pathlib import Path

import optuna

from autotune.objective import Goal, ObjectiveName, score
from autotune.prescreen import memory_margin
from autotune.replay.load import LoadSpec
from autotune.sim.flags import parse_serve_args
from autotune.sim.predict import predict
from autotune.space import SEARCH_SPACES_DIR, SearchSpace, load_space
from autotune.study import make_sampler
from autotune.workload import load_plan

REPO = Path(__file__).resolve().parents[1]
GRID = {
    "kv_cache_memory_gib": [7.0, 9.0, 11.0, 13.0],
    "kv_cache_dtype": ["auto", "fp8_e4m3", "fp8_e5m2"],
    "mtp_k": [0, 1, 2, 3],
    "max_num_seqs": [2, 4, 8, 16, 32, 64],
    "max_num_batched_tokens": [2048, 8192],
    "lmcache": [False],
}


class Evaluator:
    """params -> (value, constraints) through the simulator's predictor, cached."""

    def __init__(self, space: SearchSpace, *, hardware: str, workload: Path, load: LoadSpec):
        self.space = space
        self.hardware = hardware
        self.plan = load_plan(workload)
        self.load = load
        self.goal = Goal([ObjectiveName.THROUGHPUT], [])
        self.cache: dict[tuple, tuple[float | None, dict[str, float]]] = {}

    def __call__(self, params: dict) -> tuple[float | None, dict[str, float]]:
        key = tuple(sorted(params.items()))
        if key not in self.cache:
            self.cache[key] = self._evaluate(params)
        return self.cache[key]

    def _evaluate(self, params: dict) -> tuple[float | None, dict[str, float]]:
        model = self.space.model or "qwen3.6-27b-awq"
        config = self.space.to_config(params, model=model)
        with contextlib.redirect_stderr(io.StringIO()):
            sim = parse_serve_args([*config.vllm_args(), "--hardware", self.hardware]).sim
        prediction = predict(sim, self.plan, self.load)
        report = prediction.memory
        margin = memory_margin(report.headroom_bytes, report.visible_bytes, fits=report.fits)
        scored = score(
            self.goal,
            stats=prediction.stats if prediction.records else None,
            failure=prediction.failure,
            memory_margin=margin,
        )
        return (scored.values[0] if scored.values else None), scored.constraints


def exhaustive(evaluate: Evaluator) -> tuple[float, dict]:
    best_value, best_params = 0.0, {}
    names = list(GRID)
    for values in itertools.product(*GRID.values()):
        params = dict(zip(names, values, strict=True))
        value, constraints = evaluate(params)
        if value is not None and all(v <= 0 for v in constraints.values()) and value > best_value:
            best_value, best_params = value, params
    return best_value, best_params


def search(evaluate: Evaluator, sampler_name: str, *, trials: int, seed: int) -> list[float]:
    """Best feasible value after each trial (0 while none)."""
    space = evaluate.space
    sampler = make_sampler(
        sampler_name, seed=seed, space=space, n_trials=trials, engine_version=None
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(space.baseline_params())
    best, history = 0.0, []
    worst_seen: float | None = None
    for _ in range(trials):
        trial = study.ask()
        params = space.suggest(trial)
        value, constraints = evaluate(params)
        for key, margin in constraints.items():
            trial.set_constraint(key, margin)
        feasible = value is not None and all(v <= 0 for v in constraints.values())
        if value is not None:
            worst_seen = value if worst_seen is None else min(worst_seen, value)
        study.tell(trial, value if value is not None else (worst_seen or 0.0))
        if feasible:
            best = max(best, value)
        history.append(best)
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--hardware", default="rtx4080s-32g")
    parser.add_argument(
        "--workload", type=Path, default=REPO / "workloads" / "sample-claudecode.jsonl"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)

    space = load_space(SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml")
    load = LoadSpec(mode="sessions", concurrency=8)
    evaluate = Evaluator(space, hardware=args.hardware, workload=args.workload, load=load)
    started = time.monotonic()
    optimum, optimum_params = exhaustive(evaluate)
    grid_s = time.monotonic() - started
    baseline_value, _ = evaluate(space.baseline_params())

    rows = {}
    for sampler_name in ("gp", "tpe", "random"):
        finals, reach = [], []
        for seed in range(args.seeds):
            history = search(evaluate, sampler_name, trials=args.trials, seed=seed)
            finals.append(history[-1] / optimum)
            hits = [i + 1 for i, value in enumerate(history) if value >= 0.95 * optimum]
            reach.append(hits[0] if hits else None)
        rows[sampler_name] = {
            "best_over_optimum_median": statistics.median(finals),
            "best_over_optimum_min": min(finals),
            "trials_to_95pct": [r for r in reach],
        }
    result = {
        "grid_points": len(list(itertools.product(*GRID.values()))),
        "grid_seconds": round(grid_s, 1),
        "optimum_tok_s": optimum,
        "optimum_params": optimum_params,
        "baseline_tok_s": baseline_value,
        "samplers": rows,
        "gp_vs_random": rows["gp"]["best_over_optimum_median"]
        / rows["random"]["best_over_optimum_median"],
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"exhaustive grid: {result['grid_points']} configs in {grid_s:.0f} s; "
        f"optimum {optimum:,.1f} tok/s; baseline {baseline_value or 0:,.1f} tok/s"
    )
    print(f"optimum: {optimum_params}")
    print(
        f"\n{'sampler':<8} {'best/optimum (median)':>22} {'worst seed':>11} {'trials to 95%':>16}"
    )
    for name, row in rows.items():
        print(
            f"{name:<8} {row['best_over_optimum_median']:>22.3f} "
            f"{row['best_over_optimum_min']:>11.3f} {row['trials_to_95pct']!s:>16}"
        )
    print(f"\nGP vs random (median best): {result['gp_vs_random']:.3f}x")


if __name__ == "__main__":
    main()
