"""`autotune replay`'s entry: one or several replays against a running server, in one event loop.

A sweep runs the same workload at each concurrency in turn, the table people
run by hand (concurrency, wall time, mean latency, aggregate output tok/s,
TTFT, TPOT); each level is a fresh replay with its own /metrics deltas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from autotune.errors import InputError
from autotune.replay.load import LoadSpec, ReplayObserver, RequestSlo
from autotune.replay.metrics import NEAR_ZERO_HIT_RATE, explain_prefix_cache
from autotune.replay.runner import UNANSWERED_LIMIT_S, ReplayResult, replay
from autotune.workload.plan import WorkloadPlan
from autotune.workload.stats import IdealPrefixHits


class LevelResult(BaseModel):
    """One replay of a sweep: the load it ran under and what it measured."""

    model_config = ConfigDict(frozen=True)

    load: LoadSpec
    result: ReplayResult
    prefix_cache_note: str | None = None  # why the prefix cache missed, when it did


def sweep_loads(base: LoadSpec, concurrencies: Sequence[int]) -> list[LoadSpec]:
    """``base`` at each concurrency (``base`` alone when none is given)."""
    if not concurrencies:
        return [base]
    if base.mode == "trace":
        raise InputError("--sweep: trace mode sends at recorded times; it has no concurrency")
    return [base.model_copy(update={"concurrency": level}) for level in concurrencies]


def working_set_tokens(plan: WorkloadPlan, load: LoadSpec) -> int | None:
    """Tokens that must stay cached for sessions to hit their own history (sessions mode):
    the ``concurrency`` largest sessions' longest prompts, side by side. None otherwise."""
    if load.mode != "sessions":
        return None
    longest: dict[str, int] = {}
    for request in plan.requests:
        if request.session is not None:
            longest[request.session] = max(longest.get(request.session, 0), request.prompt_tokens)
    if not longest:
        return None
    return sum(sorted(longest.values(), reverse=True)[: load.concurrency])


def _note(load: LoadSpec, result: ReplayResult, ideal: IdealPrefixHits) -> str | None:
    notes = [_miss_note(load, result, ideal), _preemption_note(result, ideal)]
    return " ".join(note for note in notes if note) or None


def _miss_note(load: LoadSpec, result: ReplayResult, ideal: IdealPrefixHits) -> str | None:
    stats = result.server_stats
    if stats is None:
        return None
    rate = stats.prefix_cache_hit_rate
    if rate is None and stats.prefix_caching_enabled is not False:
        return None
    if rate is not None and rate >= NEAR_ZERO_HIT_RATE:
        return None
    return explain_prefix_cache(
        stats,
        plan_hit_ratio=ideal.ratio(stats.block_size),
        prefix_caching_enabled=stats.prefix_caching_enabled,
        kv_cache_tokens=stats.kv_cache_tokens,
        working_set_tokens=working_set_tokens(ideal.plan, load),
    )


def _preemption_note(result: ReplayResult, ideal: IdealPrefixHits) -> str | None:
    """The server's prefix-cache counters count a preempted request's re-prefill as hits."""
    stats = result.server_stats
    if stats is None or not stats.preemptions or stats.prefix_cache_hit_rate is None:
        return None
    rate, best = stats.prefix_cache_hit_rate, ideal.ratio(stats.block_size)
    verb = "exceeds" if rate > best else "can exceed"
    note = (
        f"the server's prefix cache hit rate ({rate:.1%}) counts the re-prefill of "
        f"{stats.preemptions} preempted requests as hits, so it {verb} the {best:.1%} an "
        "infinite cache reaches on this workload"
    )
    first = result.stats.first_prefill_hit_rate
    if first is not None:
        note += f"; at first prefill, {first:.1%} of prompt tokens came from the cache"
    return note + "."


def run_sweep(
    *,
    url: str,
    plan: WorkloadPlan,
    loads: Sequence[LoadSpec],
    model_name: str = "",
    server_time_scale: float = 1.0,
    api_key: str | None = None,
    slo: RequestSlo | None = None,
    observer: ReplayObserver | None = None,
) -> list[LevelResult]:
    """Replay ``plan`` under each load in turn (one ``asyncio.run``).

    Raises ServerNotAnswering when the server stops answering (``UNANSWERED_LIMIT_S``):
    nobody else watches this replay, so it must not wait for ever on a stopped server.
    """

    ideal = IdealPrefixHits(plan)

    async def run_all() -> list[LevelResult]:
        levels = []
        for load in loads:
            result = await replay(
                url=url,
                plan=plan,
                load=load,
                model_name=model_name,
                server_time_scale=server_time_scale,
                api_key=api_key,
                slo=slo,
                observer=observer,
                unanswered_limit_s=UNANSWERED_LIMIT_S,
            )
            levels.append(
                LevelResult(load=load, result=result, prefix_cache_note=_note(load, result, ideal))
            )
        return levels

    return asyncio.run(run_all())
