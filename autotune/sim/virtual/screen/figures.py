"""The queue's per-request arrays as a replay's stats, one per config."""

from __future__ import annotations

import numpy as np

from autotune.replay.load import RequestSlo
from autotune.replay.records import Percentiles, ReplayStats
from autotune.sim.virtual.screen.traffic import Traffic

QUANTILES = (50, 90, 95, 99)


def figures(
    window: np.ndarray,
    ttft: np.ndarray,
    tpot: np.ndarray,
    itl: np.ndarray,
    e2e: np.ndarray,
    traffic: Traffic,
    slo: RequestSlo | None,
) -> list[ReplayStats]:
    """Each config's figures (one row of the arrays per config; a TPOT of NaN: a
    one-token output, which has none)."""
    count, completed = ttft.shape
    output, prompt = float(traffic.output.sum()), float(traffic.prompt.sum())
    goodput: list[float | None] = [None] * count
    if slo is not None:
        good = np.ones((count, completed), dtype=bool)
        if slo.ttft_s is not None:
            good &= ttft <= slo.ttft_s
        if slo.tpot_s is not None:
            good &= ~(tpot > slo.tpot_s)
        if slo.e2e_s is not None:
            good &= e2e <= slo.e2e_s
        goodput = list(good.sum(axis=1) / window)
    measured = ~np.isnan(tpot[0]) if count else np.zeros(0, dtype=bool)  # the same columns
    columns = zip(
        percentiles(ttft),
        percentiles(tpot[:, measured]),
        percentiles(itl),
        percentiles(e2e),
        strict=True,
    )
    return [
        ReplayStats(
            duration_s=float(window[c]),
            completed=completed,
            failed=0,
            total_input_tokens=int(prompt),
            total_output_tokens=int(output),
            request_throughput_rps=completed / window[c],
            output_throughput_tok_s=output / window[c],
            total_token_throughput_tok_s=(output + prompt) / window[c],
            goodput_rps=None if goodput[c] is None else float(goodput[c]),
            ttft=t,
            tpot=p,
            itl=i,
            e2e=e,
        )
        for c, (t, p, i, e) in enumerate(columns)
    ]


def percentiles(values: np.ndarray) -> list[Percentiles]:
    """Mean and percentiles of each row (no columns: not measured)."""
    count, columns = values.shape
    if not columns:
        return [Percentiles() for _ in range(count)]
    mean = values.mean(axis=1)
    p50, p90, p95, p99 = np.percentile(values, QUANTILES, axis=1)
    return [
        Percentiles(mean=float(m), p50=float(a), p90=float(b), p95=float(c), p99=float(d))
        for m, a, b, c, d in zip(mean, p50, p90, p95, p99, strict=True)
    ]
