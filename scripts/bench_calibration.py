"""Does calibrating on a few points ever make the simulator worse? Held-out error, in one run.

Tables with a known truth: the simulator with its speed constants perturbed (each fitted
constant by a factor of up to e^+-spread, MTP acceptance by e^-spread to e^(spread/4),
seeded per table) measures a closed-loop table of 20 cells (concurrency 1-16 x MTP 0-3)
on the RTX 4080 Super with Qwen3.6-27B, with 3% noise on each figure. Spread 0.25: a
GPU well off the catalog; 0.05: the catalog nearly right (as on the real closed-loop
tables, where the uncalibrated median error is under 4%), where a fit can only chase
noise. Each run fits on 4 (or 8) cells drawn at random and is judged on the rest: the
median and worst absolute error of the predicted output tok/s, for

- uncalibrated: the catalog's constants;
- baseline: the fit before cross-validation chose the prior (a weak prior, weight 0.03,
  always kept: what `sim calibrate` did at 6e1cab5);
- ours: `calibrate`: the catalog kept when the points are within measurement noise of it
  (`catalog_p_value`), else the prior's strength chosen by cross-validation, the catalog
  kept when no fit beats it held out.

Then the measured vllm-cpu tables in docs/measurements/ (tiny model, 2-vCPU host): fit on
the 4 corners, judged on the 4 other cells.

    python scripts/bench_calibration.py [--seeds 4] [--jobs 2]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from autotune.calibration.fit import (
    ALWAYS_FITTED,
    MTP_FITTED,
    Target,
    calibrate,
    fit_constants,
    point_target,
    predicted,
)
from autotune.calibration.points import MeasuredPoint, load_points
from autotune.catalog.models import get_model
from autotune.sim.model.speed_constants import BOUNDS, DEFAULT_CONSTANTS, SpeedConstants

CARD, QWEN = "rtx4080s-32g", "qwen3.6-27b-awq"
CONCURRENCY = (1, 2, 4, 8, 16)
MTP = (0, 1, 2, 3)
NOISE = 0.03
MEASUREMENTS = Path(__file__).resolve().parents[1] / "docs" / "measurements"
OLD_PRIOR_WEIGHT = 0.03


def truth(seed: int, spread: float) -> SpeedConstants:
    """The catalog's constants, each fitted one moved by up to +-``spread`` (log), MTP
    acceptance scaled as much: a real GPU off the catalog, or nearly on it."""
    rng = random.Random(seed)
    update: dict[str, object] = {}
    for name in (*ALWAYS_FITTED, *MTP_FITTED):
        value = getattr(DEFAULT_CONSTANTS, name)
        if value:
            low, high = BOUNDS[name]
            update[name] = min(high, max(low, value * math.exp(rng.uniform(-spread, spread))))
    rates = DEFAULT_CONSTANTS.mtp_acceptance or get_model(QWEN).default_mtp_acceptance
    factor = math.exp(rng.uniform(-spread, spread / 4))
    update["mtp_acceptance"] = tuple(min(0.99, rate * factor) for rate in rates)
    return DEFAULT_CONSTANTS.model_copy(update=update)


def table(seed: int, spread: float) -> list[Target]:
    """20 measured cells of one truth, 3% noise on tok/s and latency."""
    constants, rng = truth(seed, spread), random.Random(seed + 1000)
    cells = []
    for concurrency in CONCURRENCY:
        for mtp in MTP:
            shape = MeasuredPoint(
                concurrency=concurrency, mtp=mtp, prompt_tokens=512, output_tokens=128,
                output_tokens_per_s=1.0, mean_latency_s=1.0, requests_per_client=2,
            )  # fmt: skip
            target = point_target(CARD, QWEN, shape)
            figures = predicted(target, constants)
            assert figures is not None, shape.label
            tok_s = figures[0] * (1 + rng.gauss(0, NOISE))
            latency_s = figures[1] * (1 + rng.gauss(0, NOISE))
            point = shape.model_copy(
                update={"output_tokens_per_s": tok_s, "mean_latency_s": latency_s}
            )
            cells.append(point_target(CARD, QWEN, point))
    return cells


def held_out_errors(rest: list[Target], constants: SpeedConstants) -> list[float]:
    errors = []
    for target in rest:
        figures = predicted(target, constants)
        errors.append(9.0 if figures is None else abs(figures[0] / target.tok_s - 1))
    return errors


def one_run(job: tuple[int, int, float]) -> dict[str, list[float]]:
    """Fit ``size`` cells of table ``seed``; held-out tok/s errors of each arm."""
    seed, size, spread = job
    cells = table(seed, spread)
    chosen = sorted(random.Random(seed * 7 + size).sample(range(len(cells)), size))
    fitted = [cells[index] for index in chosen]
    rest = [cell for index, cell in enumerate(cells) if index not in chosen]
    ours = calibrate(fitted, hardware=CARD, model=QWEN, source="bench")
    old = fit_constants(fitted, prior_weight=OLD_PRIOR_WEIGHT)
    return {
        "uncalibrated": held_out_errors(rest, DEFAULT_CONSTANTS),
        "baseline": held_out_errors(rest, old),
        "ours": held_out_errors(rest, ours.constants),
        "kept catalog": [1.0 if ours.prior_weight is None else 0.0],
    }


def vllm_cpu_rows() -> list[tuple[str, dict[str, list[float]]]]:
    rows = []
    for name in ("vllm-cpu-0.32-tiny.json", "vllm-cpu-0.32-tiny-session2.json"):
        points = load_points(MEASUREMENTS / name)
        cells = [point_target("cpu-2c", "tiny-qwen2", point) for point in points]
        lows = {min(p.concurrency for p in points), max(p.concurrency for p in points)}
        corners = [
            index
            for index, point in enumerate(points)
            if point.concurrency in lows and point.mtp in {0, max(p.mtp for p in points)}
        ]
        fitted = [cells[index] for index in corners]
        rest = [cell for index, cell in enumerate(cells) if index not in corners]
        ours = calibrate(fitted, hardware="cpu-2c", model="tiny-qwen2", source=name)
        old = fit_constants(fitted, prior_weight=OLD_PRIOR_WEIGHT)
        rows.append(
            (
                f"{name}: {len(fitted)} corners fitted, {len(rest)} held out",
                {
                    "uncalibrated": held_out_errors(rest, DEFAULT_CONSTANTS),
                    "baseline": held_out_errors(rest, old),
                    "ours": held_out_errors(rest, ours.constants),
                    "kept catalog": [1.0 if ours.prior_weight is None else 0.0],
                },
            )
        )
    return rows


def _print(title: str, runs: list[dict[str, list[float]]]) -> None:
    arms = ("uncalibrated", "baseline", "ours")
    medians = {arm: [statistics.median(run[arm]) for run in runs] for arm in arms}
    worsts = {arm: [max(run[arm]) for run in runs] for arm in arms}
    raw = medians["uncalibrated"]
    worse = {arm: sum(m > u + 1e-9 for m, u in zip(medians[arm], raw, strict=True)) for arm in arms}
    kept = sum(run["kept catalog"][0] for run in runs)
    print(f"\n### {title} ({len(runs)} runs; ours kept the catalog in {kept:.0f})\n")
    print("| arm | held-out median error (median of runs) | worst cell (median of runs) |"
          " runs worse than uncalibrated | median / uncalibrated |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: |")
    for arm in arms:
        median = statistics.median(medians[arm])
        ratio = median / statistics.median(raw) if statistics.median(raw) else float("nan")
        print(
            f"| {arm} | {median:.1%} | {statistics.median(worsts[arm]):.1%} | "
            f"{worse[arm]}/{len(runs)} | {ratio:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4, help="perturbed tables per size")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--spread", type=float, action="append", help="truths' log spread (default 0.25, 0.05)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8], help="cells fitted")
    parser.add_argument("--no-vllm-cpu", action="store_true", help="skip the measured tables")
    args = parser.parse_args()
    with ProcessPoolExecutor(args.jobs) as pool:
        for spread in args.spread or [0.25, 0.05]:
            for size in args.sizes:
                jobs = [(seed, size, spread) for seed in range(1, args.seeds + 1)]
                title = f"truths within e^+-{spread:g} of the catalog, 20 cells, {size} fitted"
                _print(title, list(pool.map(one_run, jobs)))
    if args.no_vllm_cpu:
        return
    for title, run in vllm_cpu_rows():
        _print(title, [run])


if __name__ == "__main__":
    main()
