"""One replay stands for every KV pool size that never bounds it.

Configs that differ only in their KV pool (``--kv-cache-memory-bytes``,
``--gpu-memory-utilization``) schedule alike as long as no capacity check of
the pool and no run-time OOM check ever decides otherwise: while every check a
replay made passes in the other pool too, each step schedules the same
requests, so the clock, the records and the counters are the same. A replay
records the most blocks any check asked for (``KvCacheManager.peak_demand_blocks``)
and the largest transient weighed against the headroom
(``SimEngineCore.peak_transient_bytes``); another pool with at least that many
blocks and that much headroom gets that replay's answer, with its own memory
report and its own KV usage. A lattice (the warm start, a what-if) varies the
pool in a few steps per config, so most of its predictions are answered here.

``SharedRuns`` keeps the recent replays of one process, bounded by the records
they hold.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.sim.model.memory import MemoryReport
from autotune.vocabulary import StartupReport

if TYPE_CHECKING:
    from autotune.sim.model.scheduler import SimEngineCore
    from autotune.sim.virtual.predict import Prediction

MAX_RECORDS = 50_000  # records kept over every replay held, per process
# The memory report's fields that follow from the pool's size alone.
POOL_FIELDS = frozenset(
    {
        "fits",
        "failure_class",
        "failure_message",
        "requested_bytes",
        "kv_cache_bytes",
        "headroom_bytes",
        "kv_cache_tokens",
        "max_concurrency",
        "num_gpu_blocks",
    }
)


@dataclass(frozen=True)
class _Run:
    prediction: Prediction
    demand_blocks: int  # the pool it needs to take the same decisions
    transient_bytes: float  # the headroom it needs
    total_blocks: int  # its own pool, for its KV usage


def run_key(engine: SimEngineCore, inputs: tuple[Any, ...]) -> str:
    """What a replay's schedule depends on besides the pool's size: the engine's config
    and memory geometry, its speed constants and draws, and ``inputs`` (the plan, load,
    SLO, seed, noise, acceptance)."""
    config = engine.config.model_copy(
        update={"kv_cache_memory_bytes": None, "gpu_memory_utilization": 0.0}
    )
    geometry = engine.memory.model_dump(mode="json", exclude=set(POOL_FIELDS))
    return json.dumps(
        [
            config.model_dump(mode="json"),
            geometry,
            engine.constants.model_dump(mode="json"),
            [repr(item) for item in inputs],
        ],
        sort_keys=True,
    )


class SharedRuns:
    """Recent replays by ``run_key``; ``find`` answers another pool from one of them."""

    def __init__(self, max_records: int = MAX_RECORDS) -> None:
        self._runs: OrderedDict[str, list[_Run]] = OrderedDict()
        self._records = 0
        self._max_records = max_records
        self.hits = 0  # predictions answered from a kept replay

    def find(self, key: str, engine: SimEngineCore, startup: StartupReport) -> Prediction | None:
        """A kept replay's answer for ``engine``'s pool (``startup``: its startup report),
        or None if none stands for it."""
        pool = engine.kv_pool.total_blocks
        memory = engine.memory
        for run in self._runs.get(key, ()):
            if run.demand_blocks <= pool and run.transient_bytes <= memory.headroom_bytes:
                self._runs.move_to_end(key)
                self.hits += 1
                return _for_pool(run, memory, pool, startup)
        return None

    def keep(self, key: str, engine: SimEngineCore, prediction: Prediction) -> None:
        """Keep a replay that ran to its end (no OOM) within its own pool."""
        pool = engine.kv_pool
        if prediction.failure is not None or pool.peak_demand_blocks > pool.total_blocks:
            return
        demand, transient = pool.peak_demand_blocks, engine.peak_transient_bytes
        run = _Run(prediction, demand, transient, pool.total_blocks)
        self._runs.setdefault(key, []).append(run)
        self._runs.move_to_end(key)
        self._records += len(prediction.records)
        while self._records > self._max_records and len(self._runs) > 1:
            _, dropped = self._runs.popitem(last=False)
            self._records -= sum(len(old.prediction.records) for old in dropped)


def _for_pool(
    run: _Run, memory: MemoryReport, total_blocks: int, startup: StartupReport
) -> Prediction:
    kept = run.prediction
    usage = kept.server_stats.peak_kv_cache_usage
    if usage and total_blocks:  # the peak's blocks in use, over this pool (as usage() divides)
        usage = round(usage * run.total_blocks) / total_blocks
    server_stats = kept.server_stats.model_copy(
        update={
            "peak_kv_cache_usage": usage,
            "kv_cache_tokens": memory.kv_cache_tokens,
            "block_size": memory.block_size,
        }
    )
    return kept.model_copy(
        update={"memory": memory, "startup": startup, "server_stats": server_stats}
    )
