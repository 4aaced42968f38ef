"""The simulator held to published runs: per-point errors, per-GPU summaries, GPU pairs.

Each point is compared on three figures, the ones a user decides by:

- throughput: output tok/s (total tok/s where the source gives only that);
- TPOT: median time per output token (the mean where only that is given);
- TTFT: median time to first token (likewise).

Errors are ``predicted / published - 1``. Points the simulator sees as one run (same
GPU, tensor parallelism, catalog model, KV dtype and benchmark shape) published by
different sources or as different fine-tunes are a *same-run group*: when their
published throughputs spread by more than ``THROUGHPUT_GOAL``, the group counts once, its
error taken against the median of its measurements, and the table shows the spread.

Pairs (points with the same ``pair`` key: one source, one benchmark, different GPUs) are
compared as ratios of GPU speed: throughput where the load is all at once (``--request-rate
inf``), else 1/TPOT (at a set request rate both GPUs serve the same requests/s, so
throughput does not tell them apart). A published ratio within ``TIE`` of 1 has no ordering
to get wrong.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.calibration.published import PublishedPoint
from autotune.calibration.published_predict import (
    NotPredicted,
    PredictedFigures,
    catalog_model,
    predict_point,
)
from autotune.sim.model.speed_constants import SpeedConstants

THROUGHPUT_GOAL = 0.08  # median |error| of output throughput
THROUGHPUT_WORST_GOAL = 0.25
TPOT_GOAL = 0.08
TTFT_GOAL = 0.20
PAIR_GOAL = 0.10  # predicted GPU ratio within this of the published one ...
PAIR_SHARE_GOAL = 0.90  # ... in this share of pairs
TIE = 0.02  # a published ratio this close to 1 has no ordering


@dataclass(frozen=True)
class PointResult:
    """One point: its published and predicted figures (ms, tok/s), or why not predicted."""

    point: PublishedPoint
    predicted: PredictedFigures | None
    skipped: str | None = None

    @property
    def throughput_kind(self) -> str:
        return "output" if self.point.figures.output_throughput_tok_s else "total"

    def published_throughput(self) -> float | None:
        figures = self.point.figures
        return figures.output_throughput_tok_s or figures.total_token_throughput_tok_s

    def predicted_throughput(self) -> float | None:
        if self.predicted is None:
            return None
        if self.throughput_kind == "output":
            return self.predicted.output_throughput_tok_s
        return self.predicted.total_token_throughput_tok_s

    def published_tpot_ms(self) -> float | None:
        return self.point.figures.median_tpot_ms or self.point.figures.mean_tpot_ms

    def predicted_tpot_ms(self) -> float | None:
        if self.predicted is None:
            return None
        median = self.point.figures.median_tpot_ms is not None
        value = self.predicted.median_tpot_s if median else self.predicted.mean_tpot_s
        return None if value is None else value * 1e3

    def published_ttft_ms(self) -> float | None:
        return self.point.figures.median_ttft_ms or self.point.figures.mean_ttft_ms

    def predicted_ttft_ms(self) -> float | None:
        if self.predicted is None:
            return None
        median = self.point.figures.median_ttft_ms is not None
        value = self.predicted.median_ttft_s if median else self.predicted.mean_ttft_s
        return None if value is None else value * 1e3

    def error(self, figure: str) -> float | None:
        """``predicted / published - 1`` of ``figure`` (throughput, tpot, ttft), or None."""
        published = getattr(self, f"published_{FIGURE_METHODS[figure]}")()
        predicted = getattr(self, f"predicted_{FIGURE_METHODS[figure]}")()
        if not published or predicted is None:
            return None
        return predicted / published - 1


FIGURE_METHODS = {"throughput": "throughput", "tpot": "tpot_ms", "ttft": "ttft_ms"}
FIGURES = tuple(FIGURE_METHODS)


def predict_all(
    points: Sequence[PublishedPoint],
    constants_for: Callable[[str], SpeedConstants | None] = lambda gpu: None,
) -> list[PointResult]:
    """Every point predicted (``constants_for(gpu)``: the constants to use; None: the
    catalog's)."""
    results = []
    for point in points:
        try:
            results.append(PointResult(point, predict_point(point, constants_for(point.gpu))))
        except NotPredicted as exc:
            results.append(PointResult(point, None, skipped=str(exc)))
    return results


def run_key(result: PointResult) -> tuple[object, ...] | None:
    """What makes two points one run for the simulator (None: not predicted)."""
    if result.predicted is None:
        return None
    point, bench = result.point, result.point.benchmark
    return (
        point.gpu, point.tensor_parallel, catalog_model(point), point.kv_cache_dtype,
        bench.dataset, bench.input_len, bench.output_len, bench.num_prompts,
        bench.max_concurrency, bench.request_rate,
    )  # fmt: skip


@dataclass(frozen=True)
class Scored:
    """One counted entry of the table: a point, or a same-run group whose published
    figures spread by more than the goal (then errors against the group's median)."""

    results: tuple[PointResult, ...]
    spread: float | None  # max / min - 1 of published throughput; None: a single point

    @property
    def gpu(self) -> str:
        return self.results[0].point.gpu

    @property
    def sources(self) -> set[str]:
        return {result.point.source for result in self.results}

    def error(self, figure: str) -> float | None:
        if len(self.results) == 1:
            return self.results[0].error(figure)
        method = FIGURE_METHODS[figure]
        published = [getattr(r, f"published_{method}")() for r in self.results]
        predicted = [getattr(r, f"predicted_{method}")() for r in self.results]
        published = [value for value in published if value]
        predicted = [value for value in predicted if value is not None]
        if not published or not predicted:
            return None
        return statistics.median(predicted) / statistics.median(published) - 1


def scored(results: Sequence[PointResult]) -> list[Scored]:
    """The table's entries: points, with same-run groups that disagree merged."""
    groups: dict[tuple[object, ...], list[PointResult]] = {}
    entries: list[Scored] = []
    for result in results:
        key = run_key(result)
        if key is not None:
            groups.setdefault(key, []).append(result)
    for members in groups.values():
        values = [m.published_throughput() for m in members if m.published_throughput()]
        spread = max(values) / min(values) - 1 if len(values) > 1 else None
        if spread is not None and spread > THROUGHPUT_GOAL:
            entries.append(Scored(tuple(members), spread))
        else:
            entries.extend(Scored((member,), spread) for member in members)
    return entries


@dataclass(frozen=True)
class Summary:
    """Median and worst |error| of each figure over some entries."""

    entries: int
    points: int
    sources: int
    median: dict[str, float | None]
    worst: dict[str, float | None]


def summarize(entries: Sequence[Scored]) -> Summary:
    median: dict[str, float | None] = {}
    worst: dict[str, float | None] = {}
    for figure in FIGURES:
        errors = [abs(e) for entry in entries if (e := entry.error(figure)) is not None]
        median[figure] = statistics.median(errors) if errors else None
        worst[figure] = max(errors) if errors else None
    return Summary(
        entries=len(entries),
        points=sum(len(entry.results) for entry in entries),
        sources=len(set().union(*(entry.sources for entry in entries))) if entries else 0,
        median=median,
        worst=worst,
    )


def by_gpu(entries: Sequence[Scored]) -> dict[str, Summary]:
    """A summary per GPU, GPUs in order of first appearance."""
    gpus: dict[str, list[Scored]] = {}
    for entry in entries:
        gpus.setdefault(entry.gpu, []).append(entry)
    return {gpu: summarize(members) for gpu, members in gpus.items()}


@dataclass(frozen=True)
class PairResult:
    """Two GPUs measured alike: the published and predicted ratio of B's speed to A's."""

    key: str
    first: PointResult
    second: PointResult
    figure: str  # "throughput" or "1/TPOT"
    published_ratio: float
    predicted_ratio: float

    @property
    def ratio_error(self) -> float:
        return self.predicted_ratio / self.published_ratio - 1

    @property
    def ordered(self) -> bool:
        """Whether the prediction orders the two GPUs as published (a tie always is)."""
        if abs(self.published_ratio - 1) <= TIE:
            return True
        return (self.published_ratio > 1) == (self.predicted_ratio > 1)


def _speed(result: PointResult, figure: str) -> tuple[float | None, float | None]:
    if figure == "throughput":
        return result.published_throughput(), result.predicted_throughput()
    published, predicted = result.published_tpot_ms(), result.predicted_tpot_ms()
    return (1 / published if published else None), (1 / predicted if predicted else None)


def pairs(results: Sequence[PointResult]) -> list[PairResult]:
    """Every two predicted points of one ``pair`` key on different GPUs."""
    keyed: dict[str, list[PointResult]] = {}
    for result in results:
        if result.point.pair and result.predicted is not None:
            keyed.setdefault(result.point.pair, []).append(result)
    out: list[PairResult] = []
    for key, members in keyed.items():
        for first, second in itertools.combinations(members, 2):
            if first.point.gpu == second.point.gpu:
                continue
            burst = math.isinf(first.point.benchmark.request_rate)
            figure = "throughput" if burst else "1/TPOT"
            (pub_a, pred_a), (pub_b, pred_b) = _speed(first, figure), _speed(second, figure)
            if not (pub_a and pred_a and pub_b and pred_b):
                continue
            out.append(PairResult(key, first, second, figure, pub_b / pub_a, pred_b / pred_a))
    return out


def summary_rows(entries: Sequence[Scored]) -> dict[str, dict[str, float | int | None]]:
    """Per GPU, what the catalog keeps of the table (catalog/provenance.py's file)."""
    return {
        gpu: {
            "points": summary.points,
            "sources": summary.sources,
            "throughput_median_error": summary.median["throughput"],
            "throughput_worst_error": summary.worst["throughput"],
            "tpot_median_error": summary.median["tpot"],
            "ttft_median_error": summary.median["ttft"],
        }
        for gpu, summary in by_gpu(entries).items()
    }
