"""A ``vllm bench serve`` run in autotune's terms: its load and its printed summary.

``bench_load`` turns vLLM's load flags into a ``LoadSpec``: ``--request-rate inf`` (the
default) sends every request at once, so with ``--max-concurrency N`` it is a closed loop
of N (``concurrency``), and without, a closed loop of ``--num-prompts``; a finite rate
is an open loop at the plan's arrivals (``trace``), with ``--max-concurrency`` as its
cap on requests in flight (``max_in_flight``). Nothing is stopped early and nothing is
left out of the window: vLLM measures every request, from the first send to the last
completion.

``serving_result`` prints the figures as vLLM 0.32 prints them ("Serving Benchmark
Result", the same labels and formats), from a ``ReplayStats``, so the two can be read
side by side; vLLM's "Peak output token throughput" needs per-token times and is left
out.
"""

from __future__ import annotations

import math

from autotune.replay.load import LoadSpec
from autotune.replay.records import Percentiles, ReplayStats

VLLM_REQUEST_TIMEOUT_S = 6 * 3600.0  # vllm bench serve's AIOHTTP timeout


def bench_load(*, num_prompts: int, max_concurrency: int | None, request_rate: float) -> LoadSpec:
    """The replay load of ``vllm bench serve --num-prompts --max-concurrency --request-rate``."""
    common = dict(
        saturation_stop=False,
        request_timeout_s=VLLM_REQUEST_TIMEOUT_S,
        warmup_requests=0,
        max_gap_s=None,
    )
    if math.isinf(request_rate):
        return LoadSpec(mode="concurrency", concurrency=max_concurrency or num_prompts, **common)
    return LoadSpec(mode="trace", max_in_flight=max_concurrency, **common)


def _line(label: str, value: object) -> str:
    text = f"{value:<10.2f}" if isinstance(value, float) else f"{value!s:<10}"
    return f"{label:<40} {text}"


def _latency(lines: list[str], name: str, header: str, values: Percentiles) -> None:
    lines.append(f"{header:-^50}")
    for label, value in (("Mean", values.mean), ("Median", values.p50), ("P99", values.p99)):
        lines.append(_line(f"{label} {name} (ms):", (value or 0.0) * 1e3))


def serving_result(
    stats: ReplayStats, *, max_concurrency: int | None, request_rate: float
) -> list[str]:
    """vLLM's "Serving Benchmark Result" block for ``stats``, line by line."""
    lines = [f"{' Serving Benchmark Result ':=^50}"]
    lines.append(_line("Successful requests:", stats.completed))
    lines.append(_line("Failed requests:", stats.failed))
    if max_concurrency is not None:
        lines.append(_line("Maximum request concurrency:", max_concurrency))
    if not math.isinf(request_rate):
        lines.append(_line("Request rate configured (RPS):", float(request_rate)))
    lines.append(_line("Benchmark duration (s):", stats.duration_s))
    lines.append(_line("Total input tokens:", stats.total_input_tokens))
    lines.append(_line("Total generated tokens:", stats.total_output_tokens))
    lines.append(_line("Request throughput (req/s):", stats.request_throughput_rps))
    lines.append(_line("Output token throughput (tok/s):", stats.output_throughput_tok_s))
    lines.append(_line("Peak concurrent requests:", float(stats.max_concurrent_requests)))
    lines.append(_line("Total token throughput (tok/s):", stats.total_token_throughput_tok_s))
    _latency(lines, "TTFT", "Time to First Token", stats.ttft)
    _latency(lines, "TPOT", "Time per Output Token (excl. 1st token)", stats.tpot)
    _latency(lines, "ITL", "Inter-token Latency", stats.itl)
    lines.append("=" * 50)
    return lines
