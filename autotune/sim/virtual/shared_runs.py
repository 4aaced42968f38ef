"""One replay stands for every config whose limits it never reached.

Configs that differ only in their KV pool (``--kv-cache-memory-bytes``,
``--gpu-memory-utilization``) and seats (``--max-num-seqs`` and the CUDA-graph
sizes derived from it) schedule alike as long as no check of those limits ever
decides otherwise: while every check a replay made passes in the other config
too, each step schedules the same requests at the same cost, so the clock, the
records and the counters are the same. A replay records what its checks asked
for: the most KV blocks (``KvCacheManager.peak_demand_blocks``), the largest
run-time transient weighed against the headroom
(``SimEngineCore.peak_transient_bytes``), the most seats
(``SimEngineCore.peak_seats``) and every step's token count before CUDA-graph
padding (``RooflineTimeModel.token_counts``). Another config with at least those
blocks, headroom and seats, whose capture sizes pad each of those counts alike,
gets that replay's answer, with its own memory report and KV usage. A lattice
(the warm start, a what-if) varies these flags over a few values per config, so
many of its predictions are answered here.

``SharedRuns`` keeps the recent replays of one process, bounded by the records
they hold.
"""

from __future__ import annotations

import bisect
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.sim.model.memory import MemoryReport
from autotune.vocabulary import StartupReport

if TYPE_CHECKING:
    from autotune.sim.model.scheduler import SimEngineCore
    from autotune.sim.virtual.prediction import Prediction

MAX_RECORDS = 50_000  # records kept over every replay held, per process
# The memory report's fields that follow from the pool's size and the seats alone.
LIMIT_FIELDS = frozenset(
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
        "peak_activation_bytes",
        "cudagraph_bytes",
        "max_num_seqs",
        "cudagraph_capture_sizes",
    }
)
LIMIT_FLAGS = {
    "kv_cache_memory_bytes": None,
    "gpu_memory_utilization": 0.0,
    "max_num_seqs": None,
    "cudagraph_capture_sizes": None,
}


@dataclass(frozen=True)
class _Run:
    prediction: Prediction
    demand_blocks: int  # the pool it needs to take the same decisions
    transient_bytes: float  # the headroom it needs
    seats: int  # the max_num_seqs it needs
    token_counts: tuple[int, ...]  # its steps' token counts, padded by ...
    capture_sizes: tuple[int, ...]  # ... these CUDA-graph sizes
    total_blocks: int  # its own pool, for its KV usage


def run_key(engine: SimEngineCore, inputs: tuple[Any, ...]) -> str:
    """What a replay's schedule depends on besides those limits: the engine's config and
    memory geometry, its speed constants, and ``inputs`` (the plan, load, SLO, seed,
    noise, acceptance)."""
    config = engine.config.model_copy(update=LIMIT_FLAGS)
    geometry = engine.memory.model_dump(mode="json", exclude=set(LIMIT_FIELDS))
    return json.dumps(
        [
            config.model_dump(mode="json"),
            geometry,
            engine.constants.model_dump(mode="json"),
            [repr(item) for item in inputs],
        ],
        sort_keys=True,
    )


def _padded(sizes: Sequence[int], num_tokens: int) -> int | None:
    """The capture size a step of ``num_tokens`` runs at; None: eager."""
    index = bisect.bisect_left(sizes, num_tokens)
    return sizes[index] if index < len(sizes) else None


def _stands_for(run: _Run, engine: SimEngineCore) -> bool:
    memory = engine.memory
    if not (
        run.demand_blocks <= engine.kv_pool.total_blocks
        and run.transient_bytes <= memory.headroom_bytes
        and run.seats <= memory.max_num_seqs
    ):
        return False
    sizes = memory.cudagraph_capture_sizes
    if tuple(sizes) == run.capture_sizes:
        return True
    return all(_padded(sizes, n) == _padded(run.capture_sizes, n) for n in run.token_counts)


class SharedRuns:
    """Recent replays by ``run_key``; ``find`` answers another config from one of them."""

    def __init__(self, max_records: int = MAX_RECORDS) -> None:
        self._runs: OrderedDict[str, list[_Run]] = OrderedDict()
        self._records = 0
        self._max_records = max_records
        self.hits = 0  # predictions answered from a kept replay

    def find(self, key: str, engine: SimEngineCore, startup: StartupReport) -> Prediction | None:
        """A kept replay's answer for ``engine`` (``startup``: its startup report), or None
        if none stands for it."""
        for run in self._runs.get(key, ()):
            if _stands_for(run, engine):
                self._runs.move_to_end(key)
                self.hits += 1
                return _for_limits(run, engine, startup)
        return None

    def keep(self, key: str, engine: SimEngineCore, prediction: Prediction) -> None:
        """Keep a replay that ran to its end (no OOM) within its own limits."""
        pool, memory = engine.kv_pool, engine.memory
        token_counts = getattr(engine.time_model, "token_counts", None)
        if (
            prediction.failure is not None
            or token_counts is None
            or pool.peak_demand_blocks > pool.total_blocks
            or engine.peak_seats > memory.max_num_seqs
        ):
            return
        run = _Run(
            prediction,
            demand_blocks=pool.peak_demand_blocks,
            transient_bytes=engine.peak_transient_bytes,
            seats=engine.peak_seats,
            token_counts=tuple(sorted(token_counts)),
            capture_sizes=tuple(memory.cudagraph_capture_sizes),
            total_blocks=pool.total_blocks,
        )
        self._runs.setdefault(key, []).append(run)
        self._runs.move_to_end(key)
        self._records += len(prediction.records)
        while self._records > self._max_records and len(self._runs) > 1:
            _, dropped = self._runs.popitem(last=False)
            self._records -= sum(len(old.prediction.records) for old in dropped)


def _for_limits(run: _Run, engine: SimEngineCore, startup: StartupReport) -> Prediction:
    memory: MemoryReport = engine.memory
    total_blocks = engine.kv_pool.total_blocks
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
