"""The periodic ``Engine 000: ...`` and ``SpecDecoding metrics: ...`` log lines.

vLLM logs them every ``VLLM_LOG_STATS_INTERVAL`` (10 s) from the API server,
at INFO only while the engine is busy. Here the interval is 10 *modelled*
seconds, i.e. ``10 / time_scale`` of wall time, and rates are per modelled
second, so the lines read the same at any time scale.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from autotune.sim.model.scheduler import EngineCounters
from autotune.sim.server import logs
from autotune.sim.server.logs import VllmLog
from autotune.sim.server.scaled_time_loop import EngineRunner

STATS_SOURCE = "loggers.py:276"
SPEC_SOURCE = "metrics.py:121"


@dataclass(frozen=True)
class _Snapshot:
    virtual_s: float
    prompt_tokens: int
    cached_tokens: int
    generation_tokens: int
    prefix_queries: int
    prefix_hits: int
    external_queries: int
    external_hits: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_pos: tuple[int, ...]

    @classmethod
    def of(cls, counters: EngineCounters, virtual_s: float) -> _Snapshot:
        c = counters
        return cls(
            virtual_s=virtual_s,
            prompt_tokens=c.prompt_tokens,
            cached_tokens=c.prefix_cache_hits + c.external_prefix_cache_hits,
            generation_tokens=c.generation_tokens,
            prefix_queries=c.prefix_cache_queries,
            prefix_hits=c.prefix_cache_hits,
            external_queries=c.external_prefix_cache_queries,
            external_hits=c.external_prefix_cache_hits,
            drafts=c.spec_decode_num_drafts,
            draft_tokens=c.spec_decode_num_draft_tokens,
            accepted_tokens=c.spec_decode_num_accepted_tokens,
            accepted_per_pos=tuple(c.spec_decode_accepted_per_pos),
        )


class StatsLogger:
    """Logs the engine's throughput and cache figures every ``interval_s`` modelled seconds."""

    def __init__(
        self, runner: EngineRunner, log: VllmLog, *, interval_s: float = 10.0, enabled: bool = True
    ) -> None:
        self.runner = runner
        self.log = log
        self.interval_s = interval_s
        self.enabled = enabled
        self.lmcache = runner.core.config.lmcache
        self.speculative = runner.core.config.num_speculative_tokens > 0

    async def run(self) -> None:
        if not self.enabled:
            return
        runner = self.runner
        last = _Snapshot.of(runner.core.counters, runner.virtual_now())
        while not runner.dead:
            await asyncio.sleep(self.interval_s / runner.time_scale)
            now = _Snapshot.of(runner.core.counters, runner.virtual_now())
            counters = runner.core.counters
            busy = counters.num_running or counters.num_waiting
            if busy or now.generation_tokens != last.generation_tokens:
                self._log(last, now, counters)
            last = now

    def _log(self, last: _Snapshot, now: _Snapshot, counters: EngineCounters) -> None:
        span_s = max(now.virtual_s - last.virtual_s, 1e-9)
        computed = (now.prompt_tokens - now.cached_tokens) - (
            last.prompt_tokens - last.cached_tokens
        )
        prefix_rate = now.prefix_hits / now.prefix_queries if now.prefix_queries else None
        external_rate = None
        if self.lmcache and now.external_queries:
            external_rate = now.external_hits / now.external_queries
        self.log.api(
            STATS_SOURCE,
            logs.stats_message(
                prompt_tokens_per_s=max(0, computed) / span_s,
                generation_tokens_per_s=(now.generation_tokens - last.generation_tokens) / span_s,
                running=counters.num_running,
                waiting=counters.num_waiting,
                kv_cache_usage=counters.kv_cache_usage,
                prefix_hit_rate=prefix_rate,
                external_hit_rate=external_rate,
            ),
        )
        drafts = now.drafts - last.drafts
        if self.speculative and drafts > 0:
            per_pos = [
                a - (last.accepted_per_pos[i] if i < len(last.accepted_per_pos) else 0)
                for i, a in enumerate(now.accepted_per_pos)
            ]
            self.log.api(
                SPEC_SOURCE,
                logs.spec_decode_message(
                    num_drafts=drafts,
                    num_draft_tokens=now.draft_tokens - last.draft_tokens,
                    num_accepted_tokens=now.accepted_tokens - last.accepted_tokens,
                    accepted_per_pos=per_pos,
                    interval_s=span_s,
                ),
            )
