"""Measure closed-loop points against a running server, for ``sim calibrate --points``.

The same runs the field notes' hand-run table made: N clients, each sending
fixed-size requests back to back, through the real replayer (HTTP, streaming,
``/metrics``); the point records what the replay measured and, when the
server drafted, vLLM's mean acceptance length.
"""

from __future__ import annotations

from typing import Any

from autotune.calibration.points import MeasuredPoint
from autotune.engines.base import Server
from autotune.errors import ReplayError
from autotune.replay.runner import replay
from autotune.sim.virtual.sweep import closed_loop


async def measure_point(
    server: Server,
    *,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    requests_per_client: int = 4,
    mtp: int = 0,
    flags: dict[str, Any] | None = None,
) -> MeasuredPoint:
    """Replay one closed-loop cell against ``server``; ``flags``: the point's optional fields.

    The point's ``prompt_tokens`` is the mean the server counted per request.
    """
    plan, load = closed_loop(
        concurrency,
        requests_per_client=requests_per_client,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
    )
    result = await replay(
        url=server.url,
        plan=plan,
        load=load,
        model_name=server.served_model_name,
        api_key=server.api_key,
        scrape_interval_s=None if mtp == 0 else 5.0,
    )
    stats = result.stats
    if stats.failed or not stats.completed or stats.e2e.mean is None:
        failed = next((record for record in result.records if not record.ok), None)
        detail = failed.error_detail if failed is not None else "no request completed"
        raise ReplayError(f"c={concurrency}: {stats.failed} requests failed: {detail}")
    acceptance = None
    if mtp and result.server_stats is not None:
        acceptance = result.server_stats.spec_decode_mean_acceptance_length
    return MeasuredPoint(
        concurrency=concurrency,
        mtp=mtp,
        # What the server counted (its tokenizer and chat template), not what was planned.
        prompt_tokens=round(stats.total_input_tokens / stats.completed),
        output_tokens=output_tokens,
        output_tokens_per_s=stats.output_throughput_tok_s,
        mean_latency_s=stats.e2e.mean,
        requests_per_client=requests_per_client,
        mean_acceptance_length=acceptance,
        **(flags or {}),
    )


async def measure_cells(
    server: Server,
    cells: list[tuple[int, int, int]],
    *,
    repeats: int = 3,
    requests_per_client: int = 6,
    flags: dict[str, Any] | None = None,
) -> list[MeasuredPoint]:
    """Each (concurrency, prompt, output) cell ``repeats`` times; the median-throughput run.

    The repeats are rounds over all cells, not runs of one cell back to back: a
    host whose speed drifts (other work on a shared machine, frequency scaling)
    then shifts every cell alike instead of making some cells look faster than
    their neighbours. One warm-up run first, not kept: first requests pay for
    lazy initialisation.
    """
    await measure_point(server, concurrency=2, prompt_tokens=32, output_tokens=16)
    runs: list[list[MeasuredPoint]] = [[] for _ in cells]
    for _ in range(repeats):
        for cell_runs, (concurrency, prompt_tokens, output_tokens) in zip(runs, cells, strict=True):
            cell_runs.append(
                await measure_point(
                    server,
                    concurrency=concurrency,
                    prompt_tokens=prompt_tokens,
                    output_tokens=output_tokens,
                    requests_per_client=requests_per_client,
                    flags=flags,
                )
            )
    return [
        sorted(cell_runs, key=lambda run: run.output_tokens_per_s)[len(cell_runs) // 2]
        for cell_runs in runs
    ]
