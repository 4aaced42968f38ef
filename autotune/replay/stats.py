"""Summaries of replayed requests, defined as `vllm bench serve` defines them.

``compute_stats`` turns per-request records into a ``ReplayStats``; only
records inside the measurement window (``in_window``) count. Definitions
(docs/replay.md): TTFT = send -> first content chunk; TPOT = (e2e - ttft) /
(output_tokens - 1) for requests with more than one output token; ITL = every
gap between successive content chunks, over all requests; E2E = send -> last
chunk; throughputs divide by the window's duration; percentiles interpolate
linearly (numpy's default, as vLLM does).

ITL percentiles need every gap, not only each request's mean: the client
folds its gaps into an ``ItlHistogram`` (log-spaced buckets, 0.5% resolution)
so nothing per token is kept. Without one, ITL percentiles fall back to the
per-request means weighted by their gap counts (the mean stays exact).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from autotune.replay.load import RequestSlo
from autotune.replay.records import Percentiles, ReplayStats, RequestRecord

ITL_MIN_S = 1e-7  # gaps below this land in the first bucket
ITL_MAX_S = 1e4  # gaps above this land in the last bucket
ITL_BUCKET_RATIO = 1.01  # each bucket spans 1% (its midpoint is within 0.5%)

_LOG_MIN = math.log(ITL_MIN_S)
_LOG_RATIO = math.log(ITL_BUCKET_RATIO)
_NUM_BUCKETS = math.ceil((math.log(ITL_MAX_S) - _LOG_MIN) / _LOG_RATIO) + 1

RECORD_COLUMNS = [*RequestRecord.model_fields, "tpot_s"]


class ItlHistogram:
    """Inter-token gaps over many requests, in log-spaced buckets (seconds).

    Exact count, sum and max; percentiles within half a bucket (0.5%).
    """

    def __init__(self) -> None:
        self._counts = np.zeros(_NUM_BUCKETS, dtype=np.int64)
        self.count = 0
        self.sum_s = 0.0
        self.max_s = 0.0

    def add_many(self, gaps_s: Sequence[float] | np.ndarray) -> None:
        """Fold a request's gaps (seconds) into the histogram."""
        if len(gaps_s) == 0:
            return
        gaps = np.asarray(gaps_s, dtype=np.float64)
        clipped = np.clip(gaps, ITL_MIN_S, ITL_MAX_S)
        index = ((np.log(clipped) - _LOG_MIN) / _LOG_RATIO).astype(np.int64)
        self._counts += np.bincount(index, minlength=_NUM_BUCKETS)[:_NUM_BUCKETS]
        self.count += len(gaps)
        self.sum_s += float(gaps.sum())
        self.max_s = max(self.max_s, float(gaps.max()))

    def merge(self, other: ItlHistogram) -> None:
        self._counts += other._counts
        self.count += other.count
        self.sum_s += other.sum_s
        self.max_s = max(self.max_s, other.max_s)

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0..100) in seconds, at its bucket's geometric midpoint."""
        if self.count == 0:
            return None
        rank = q / 100.0 * (self.count - 1)
        cumulative = np.cumsum(self._counts)
        bucket = int(np.searchsorted(cumulative, math.floor(rank) + 1))
        midpoint = math.exp(_LOG_MIN + (bucket + 0.5) * _LOG_RATIO)
        return min(midpoint, self.max_s)

    def percentiles(self) -> Percentiles:
        if self.count == 0:
            return Percentiles()
        return Percentiles(
            mean=self.sum_s / self.count,
            p50=self.percentile(50),
            p90=self.percentile(90),
            p95=self.percentile(95),
            p99=self.percentile(99),
        )


def percentiles_of(values: Iterable[float], weights: Iterable[float] | None = None) -> Percentiles:
    """Mean and p50/p90/p95/p99 of ``values`` (linear interpolation, as numpy/vLLM)."""
    data = np.fromiter(values, dtype=np.float64)
    if data.size == 0:
        return Percentiles()
    if weights is None:
        p50, p90, p95, p99 = np.percentile(data, [50, 90, 95, 99])
        mean = float(data.mean())
    else:
        w = np.fromiter(weights, dtype=np.float64)
        mean = float(np.average(data, weights=w))
        p50, p90, p95, p99 = np.percentile(data, [50, 90, 95, 99], weights=w, method="inverted_cdf")
    return Percentiles(mean=mean, p50=float(p50), p90=float(p90), p95=float(p95), p99=float(p99))


def _meets(record: RequestRecord, slo: RequestSlo) -> bool:
    # vLLM counts a one-token request's TPOT as 0 for goodput.
    tpot_s = record.tpot_s if record.tpot_s is not None else 0.0
    checks = (
        (slo.ttft_s, record.ttft_s),
        (slo.tpot_s, tpot_s),
        (slo.e2e_s, record.e2e_s),
    )
    return all(limit is None or (value is not None and value <= limit) for limit, value in checks)


def max_concurrency(records: Iterable[RequestRecord]) -> int:
    """The most requests in flight at once (records with a known end)."""
    events: list[tuple[float, int]] = []
    for record in records:
        if record.e2e_s is None:
            continue
        events.append((record.send_s, 1))
        events.append((record.send_s + record.e2e_s, -1))
    events.sort(key=lambda event: (event[0], event[1]))  # ends before starts at a tie
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def _window_duration_s(records: Sequence[RequestRecord]) -> float:
    if not records:
        return 0.0
    start = min(record.send_s for record in records)
    end = max(record.send_s + (record.e2e_s or 0.0) for record in records)
    return end - start


def compute_stats(
    records: Sequence[RequestRecord],
    *,
    duration_s: float | None = None,
    slo: RequestSlo | None = None,
    itl: ItlHistogram | None = None,
    stopped_early: str | None = None,
) -> ReplayStats:
    """Summarise the in-window records of one replay.

    ``duration_s`` is the measurement window in modelled seconds; by default,
    first in-window send to last in-window completion. ``itl`` carries every
    inter-token gap of the in-window requests (see module docstring).
    """
    window = [record for record in records if record.in_window]
    done = [record for record in window if record.ok]
    duration = duration_s if duration_s is not None else _window_duration_s(window)
    per_s = 1.0 / duration if duration > 0 else 0.0
    input_tokens = sum(record.prompt_tokens or 0 for record in done)
    cached = [record.cached_tokens for record in done if record.cached_tokens is not None]
    output_tokens = sum(record.output_tokens for record in done)
    if itl is not None:
        itl_stats = itl.percentiles()
    else:
        with_gaps = [r for r in done if r.itl_mean_s is not None and r.chunks > 1]
        itl_stats = percentiles_of(
            (r.itl_mean_s for r in with_gaps),  # type: ignore[misc]  # filtered above
            weights=(r.chunks - 1 for r in with_gaps),
        )
    return ReplayStats(
        duration_s=duration,
        completed=len(done),
        failed=len(window) - len(done),
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        request_throughput_rps=len(done) * per_s,
        output_throughput_tok_s=output_tokens * per_s,
        total_token_throughput_tok_s=(input_tokens + output_tokens) * per_s,
        goodput_rps=(sum(_meets(r, slo) for r in done) * per_s if slo is not None else None),
        ttft=percentiles_of(r.ttft_s for r in done if r.ttft_s is not None),
        tpot=percentiles_of(r.tpot_s for r in done if r.tpot_s is not None),
        itl=itl_stats,
        e2e=percentiles_of(r.e2e_s for r in done if r.e2e_s is not None),
        max_concurrent_requests=max_concurrency(window),
        errors_by_class=dict(Counter(r.error.value for r in window if r.error is not None)),
        stopped_early=stopped_early,
        cached_input_tokens=sum(cached) if cached else None,
    )


def records_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """One row per request (every RequestRecord field plus ``tpot_s``); saved per trial as CSV."""
    rows = [{**record.model_dump(mode="json"), "tpot_s": record.tpot_s} for record in records]
    return pd.DataFrame(rows, columns=RECORD_COLUMNS)
