"""The simulator against published vLLM measurements: the public fidelity table.

    python scripts/bench_published.py             # the table at the catalog's constants
    python scripts/bench_published.py --fit       # + per-GPU constants fitted on half of
                                                  #   the sources, judged on the other half
    python scripts/bench_published.py --write     # + rewrite the catalog's per-GPU summary
                                                  #   (catalog/data/published_fidelity.yaml)

Every point of docs/measurements/published-vllm-runs.yaml is predicted in-process (the
virtual-time replay the tuner uses) with its benchmark's shape (calibration/
published_predict.py) and compared on output throughput, median TPOT and median TTFT
(calibration/published_table.py); then per GPU, the goals, and the GPU pairs. docs/
published-fidelity.md describes the table; figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.calibration.published import PUBLISHED_FILE, load_published  # noqa: E402
from autotune.calibration.published_fit import SPLITS, fit_gpu_constants, split_points  # noqa: E402
from autotune.calibration.published_table import (  # noqa: E402
    FIGURES,
    PAIR_GOAL,
    PAIR_SHARE_GOAL,
    THROUGHPUT_GOAL,
    THROUGHPUT_WORST_GOAL,
    TPOT_GOAL,
    TTFT_GOAL,
    PairResult,
    PointResult,
    Scored,
    Summary,
    by_gpu,
    pairs,
    predict_all,
    scored,
    summarize,
    summary_rows,
)
from autotune.catalog.provenance import SUMMARY_FILE, write_summary  # noqa: E402

INF = float("inf")


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.0%}" if signed else f"{value:.0%}"


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _load(result: PointResult) -> str:
    bench = result.point.benchmark
    rate = "inf" if bench.request_rate == float("inf") else f"{bench.request_rate:g}/s"
    shape = (
        f"{bench.input_len}/{bench.output_len}"
        if bench.input_len and bench.output_len
        else bench.dataset
    )
    cap = f" c{bench.max_concurrency}" if bench.max_concurrency else ""
    return f"{shape} n{bench.num_prompts or '?'} {rate}{cap}"


def print_points(results: Sequence[PointResult]) -> None:
    print("\n## Points (published -> predicted, error)\n")
    print(
        "| point | GPU | TP | model | load | throughput tok/s | TPOT ms | TTFT ms |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for r in results:
        point = r.point
        if r.predicted is None:
            print(
                f"| {point.id} | {point.gpu} | {point.tensor_parallel} | {point.model} | "
                f"{_load(r)} | not predicted: {r.skipped} | | |"
            )
            continue
        cells = []
        for figure, method in (
            ("throughput", "throughput"),
            ("tpot", "tpot_ms"),
            ("ttft", "ttft_ms"),
        ):
            published = getattr(r, f"published_{method}")()
            predicted = getattr(r, f"predicted_{method}")()
            cells.append(
                f"{_num(published)} -> {_num(predicted)} ({_pct(r.error(figure), signed=True)})"
                if published
                else "-"
            )
        kind = "" if r.throughput_kind == "output" else " (total)"
        print(
            f"| {point.id} | {point.gpu} | {point.tensor_parallel} | {point.model} | {_load(r)} "
            f"| {cells[0]}{kind} | {cells[1]} | {cells[2]} |"
        )


def print_spreads(entries: Sequence[Scored]) -> None:
    groups = [entry for entry in entries if len(entry.results) > 1]
    print("\n## Runs published more than once that disagree (counted once, against their median)\n")
    if not groups:
        print("(none)")
        return
    print(
        "| GPU | points | published throughput | spread | error vs median |\n|---|---|---|---|---|"
    )
    for entry in groups:
        values = ", ".join(_num(r.published_throughput()) for r in entry.results)
        ids = ", ".join(r.point.id for r in entry.results)
        print(
            f"| {entry.gpu} | {ids} | {values} | {_pct(entry.spread)} | "
            f"{_pct(entry.error('throughput'), signed=True)} |"
        )


def print_summaries(title: str, summaries: dict[str, Summary], overall: Summary) -> None:
    print(f"\n## {title}\n")
    print(
        "| GPU | points | sources | throughput median | worst | TPOT median | worst | "
        "TTFT median | worst |\n|---|---|---|---|---|---|---|---|---|"
    )
    for gpu, s in [*summaries.items(), ("all", overall)]:
        cells = " | ".join(f"{_pct(s.median[f])} | {_pct(s.worst[f])}" for f in FIGURES)
        print(f"| {gpu} | {s.points} | {s.sources} | {cells} |")


def print_goals(overall: Summary, burst: Summary, pair_results: Sequence[PairResult]) -> None:
    print("\n## Goals (at the catalog's constants)\n")
    print(
        f"(at a set request rate, throughput is the offered rate whatever the GPU: over the "
        f"{burst.points} runs that send everything at once, throughput's median error is "
        f"{_pct(burst.median['throughput'])}, worst {_pct(burst.worst['throughput'])})\n"
    )
    checks = [
        ("throughput median", overall.median["throughput"], THROUGHPUT_GOAL),
        ("throughput worst", overall.worst["throughput"], THROUGHPUT_WORST_GOAL),
        ("TPOT median", overall.median["tpot"], TPOT_GOAL),
        ("TTFT median", overall.median["ttft"], TTFT_GOAL),
    ]
    for name, value, goal in checks:
        if value is None:
            print(f"- {name}: no data")
            continue
        verdict = "met" if value <= goal else f"missed by {(value - goal) * 100:.1f} points"
        print(f"- {name}: {value:.1%} (goal <= {goal:.0%}): {verdict}")
    if pair_results:
        within = sum(abs(p.ratio_error) <= PAIR_GOAL for p in pair_results) / len(pair_results)
        ordered = sum(p.ordered for p in pair_results)
        print(
            f"- GPU pairs: ratio within {PAIR_GOAL:.0%} in {within:.0%} of {len(pair_results)} "
            f"(goal >= {PAIR_SHARE_GOAL:.0%}): {'met' if within >= PAIR_SHARE_GOAL else 'missed'}; "
            f"ordering right in {ordered} of {len(pair_results)}"
        )


def print_pairs(pair_results: Sequence[PairResult]) -> None:
    print("\n## GPU pairs measured alike (ratio of B's speed to A's)\n")
    print("| pair | A | B | figure | published | predicted | ratio error | order |")
    print("|---|---|---|---|---|---|---|---|")
    for p in pair_results:
        first, second = p.first.point, p.second.point
        print(
            f"| {p.key} | {first.gpu} x{first.tensor_parallel} | {second.gpu} "
            f"x{second.tensor_parallel} | {p.figure} | {p.published_ratio:.2f} | "
            f"{p.predicted_ratio:.2f} | {_pct(p.ratio_error, signed=True)} "
            f"| {'right' if p.ordered else 'WRONG'} |"
        )


def print_fit(points: Sequence, catalog: Sequence[PointResult]) -> None:
    """Per-GPU constants fitted on one half of the sources, judged on the other half."""
    print("\n## Per-GPU constants fitted on half of the sources, judged on the other half\n")
    catalog_by_id = {r.point.id: r for r in catalog}
    for name, (fit_half, held_half) in SPLITS.items():
        fit_points, held_points = split_points(points, fit_half, held_half)
        started = time.perf_counter()
        judged = {p.gpu for p in held_points if catalog_by_id[p.id].predicted is not None}
        fitted = fit_gpu_constants(fit_points, catalog_by_id, only=judged)
        held = predict_all(held_points, fitted.get)
        before = scored([catalog_by_id[p.id] for p in held_points])
        after = scored(held)
        print(
            f"### split {name}: fitted on {', '.join(fit_half)}; held out: {', '.join(held_half)}"
        )
        print(f"(fit: {time.perf_counter() - started:.0f} s)\n")
        for gpu, constants in fitted.items():
            print(f"- {gpu}: {constants}")
        print_summaries(
            f"held-out sources, catalog constants (split {name})", by_gpu(before), summarize(before)
        )
        print_summaries(
            f"held-out sources, fitted constants (split {name})", by_gpu(after), summarize(after)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=PUBLISHED_FILE)
    parser.add_argument("--fit", action="store_true", help="fit per-GPU constants, held out")
    parser.add_argument("--write", action="store_true", help=f"rewrite {SUMMARY_FILE.name}")
    args = parser.parse_args()
    points = load_published(args.data)
    started = time.perf_counter()
    results = predict_all(points)
    entries = scored(results)
    overall = summarize(entries)
    pair_results = pairs(results)
    print(f"# The simulator against {len(points)} published vLLM runs\n")
    print(
        f"{sum(r.predicted is not None for r in results)} predicted in "
        f"{time.perf_counter() - started:.0f} s, at the catalog's constants; "
        f"errors are predicted / published - 1."
    )
    print_points(results)
    print_spreads(entries)
    print_summaries("Per GPU (catalog constants)", by_gpu(entries), overall)
    burst = summarize([e for e in entries if e.results[0].point.benchmark.request_rate == INF])
    print_goals(overall, burst, pair_results)
    print_pairs(pair_results)
    if args.fit:
        print_fit(points, results)
    if args.write:
        write_summary(summary_rows(entries))
        print(f"\nwrote {SUMMARY_FILE}")


if __name__ == "__main__":
    main()
