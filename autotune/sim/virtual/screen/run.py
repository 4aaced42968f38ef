"""``screen``: every config's figures at once (see the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.replay.load import LoadSpec, RequestSlo
from autotune.replay.records import ReplayStats
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.config import SimConfig
from autotune.sim.model.memory import MemoryReport, plan_memory
from autotune.sim.model.prompt import PromptRenderer
from autotune.sim.virtual.screen.queue import Queue
from autotune.sim.virtual.screen.terms import (
    ConfigTerms,
    StepCosts,
    as_queued,
    config_terms,
    queue_key,
)
from autotune.sim.virtual.screen.traffic import read_traffic
from autotune.vocabulary import FailureClass
from autotune.workload.plan import WorkloadPlan

CELLS_PER_BLOCK = 200_000  # configs x requests computed together (the arrays stay small)


@dataclass(frozen=True)
class Screened:
    """What the screen says of one config: its memory plan and either a failure class
    (it cannot start, or a surely-reached prefill outgrows its headroom) or its figures."""

    memory: MemoryReport
    failure: FailureClass | None
    stats: ReplayStats | None


def screen(
    configs: Sequence[SimConfig],
    plan: WorkloadPlan,
    load: LoadSpec,
    *,
    slo: RequestSlo | None = None,
    calibration: CalibrationProfile | None = None,
    acceptance: Sequence[float] = (),
    renderer: PromptRenderer | None = None,
) -> list[Screened]:
    """The screen's figures for every config, in order."""
    traffic = read_traffic(plan, load, renderer or PromptRenderer())
    results: list[Screened | None] = [None] * len(configs)
    runnable: list[tuple[int, ConfigTerms]] = []
    costs: dict[tuple, StepCosts] = {}
    for index, config in enumerate(configs):
        memory = plan_memory(config)
        if not memory.fits:
            results[index] = Screened(memory, FailureClass(memory.failure_class), None)
            continue
        terms = config_terms(config, memory, traffic, calibration, acceptance, costs)
        runnable.append((index, terms))
    # Configs the queue cannot tell apart are queued once (a KV pool that never binds,
    # seats past what is ever in flight: most of a large card's lattice).
    distinct: dict[tuple, int] = {}
    queued_terms: list[ConfigTerms] = []
    slot_of: list[int] = []
    for _, terms in runnable:
        canonical = as_queued(terms, traffic)
        key = queue_key(canonical)
        if key not in distinct:
            distinct[key] = len(queued_terms)
            queued_terms.append(canonical)
        slot_of.append(distinct[key])
    block_size = max(1, CELLS_PER_BLOCK // max(1, len(traffic.prompt)))
    queued: list[tuple[ReplayStats, float, float]] = []
    for start in range(0, len(queued_terms), block_size):
        queued += Queue(queued_terms[start : start + block_size], traffic).run(slo)
    for (index, terms), slot in zip(runnable, slot_of, strict=True):
        stats, running, step_tokens = queued[slot]
        memory = terms.memory
        seqs = min(float(memory.max_num_seqs), running)
        transient = (
            memory.transient_prefill_bytes_per_token * step_tokens
            + memory.transient_bytes_per_seq * seqs
        )
        if transient > memory.headroom_bytes:  # the largest step outgrows the headroom
            results[index] = Screened(memory, FailureClass.CUDA_OOM_LOAD, None)
        else:
            results[index] = Screened(memory, None, stats)
    return [result for result in results if result is not None]
