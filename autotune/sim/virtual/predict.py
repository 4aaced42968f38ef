"""In-process prediction: a whole replay against the scheduler core, in virtual time.

``predict`` dispatches a WorkloadPlan by the replayer's own load policy
(autotune/replay/load_policy.py: what is sent when, budget, warm-up window,
recycling salts, saturation stop) through the virtual-time driver, without
HTTP or wall time: a trial predicts in well under a second. Prompts are tokenized as the
simulated server tokenizes them (autotune.sim.model.prompt), and stats come from
``compute_stats``, so both faces of the simulator report alike.
"""

from __future__ import annotations

import functools

from autotune.catalog.models import get_model
from autotune.replay.load import LoadSpec, RequestSlo
from autotune.replay.stats import compute_stats
from autotune.sim.model.calibration_profile import CalibrationProfile, profile_constants
from autotune.sim.model.config import SimConfig
from autotune.sim.model.memory import MemoryReport
from autotune.sim.model.prompt import PromptRenderer
from autotune.sim.model.scheduler import (
    EngineCounters,
    SimEngineCore,
)
from autotune.sim.model.speed_constants import SpeedConstants
from autotune.sim.model.units import GIB
from autotune.sim.virtual.prediction import Prediction
from autotune.sim.virtual.replay import VirtualReplay
from autotune.sim.virtual.shared_runs import SharedRuns, run_key
from autotune.vocabulary import Failure, FailureClass, ServerStats, StartupReport
from autotune.workload.plan import WorkloadPlan

PLAN_RENDERERS = 4  # workloads whose tokenized prompts are kept between predictions


AGENT_SOURCES = frozenset({"claudecode", "weka", "recorder", "anthropic-log"})
CHAT_SOURCES = frozenset({"chat", "sharegpt", "mooncake"})


def workload_kind(plan: WorkloadPlan) -> str | None:
    """ "agent" (Claude Code sessions, recorded agent traffic), "chat", or None (unknown)."""
    source = plan.metadata.get("source")
    if not isinstance(source, dict):
        return None
    origin = source.get("generator") or source.get("kind")
    if origin in AGENT_SOURCES:
        return "agent"
    return "chat" if origin in CHAT_SOURCES else None


def _acceptance(
    config: SimConfig, constants: SpeedConstants, plan: WorkloadPlan
) -> list[float] | None:
    """Draft acceptance: the config's, the calibration's, else the catalog's for the plan's kind."""
    if config.mtp_acceptance is not None or constants.mtp_acceptance is not None:
        return None  # the scheduler's own precedence applies
    return list(catalog_acceptance(config.model, plan))


def catalog_acceptance(model: str, plan: WorkloadPlan) -> tuple[float, ...]:
    """The catalog's per-position draft acceptance of ``model`` for the plan's kind of
    traffic (agent or chat), else its default."""
    entry = get_model(model)
    kind = workload_kind(plan)
    found = entry.mtp_acceptance_by_kind.get(kind) if kind else None
    return tuple(found if found is not None else entry.default_mtp_acceptance)


@functools.cache
def process_shared_runs() -> SharedRuns:
    """This process's replays kept for other pool sizes (``shared_runs.py``)."""
    return SharedRuns()


def plan_renderer(plan: WorkloadPlan) -> PromptRenderer:
    """The renderer kept for ``plan``'s workload file and tokenizer: the plans cut from one
    workload (a fleet's replicas, each with a share of its sessions) render each text once.
    Its caches are keyed by the texts themselves, so sharing is always safe."""
    return _workload_renderer((plan.digest, plan.token_space))


@functools.lru_cache(maxsize=PLAN_RENDERERS)
def _workload_renderer(workload: tuple[str, str]) -> PromptRenderer:
    return PromptRenderer()


def startup_report(memory: MemoryReport) -> StartupReport:
    """What the simulated server's startup log says about ``memory``."""
    return StartupReport(
        device="GPU",
        kv_cache_tokens=memory.kv_cache_tokens,
        max_concurrency=memory.max_concurrency,
        max_concurrency_tokens_per_request=memory.max_model_len,
        attention_block_size=memory.attention_block_size,
        weights_gib=round(memory.weights_bytes / GIB, 2),
        peak_activation_gib=round(memory.peak_activation_bytes / GIB, 2),
        non_torch_gib=round(memory.non_torch_bytes / GIB, 2),
        cudagraph_gib=round(memory.cudagraph_bytes / GIB, 2),
        kv_cache_gib=round(memory.kv_cache_bytes / GIB, 2),
    )


def _server_stats(
    counters: EngineCounters, memory: MemoryReport, replay: VirtualReplay
) -> ServerStats:
    def rate(hits: int, queries: int) -> float | None:
        return hits / queries if queries else None

    spec = memory.num_speculative_tokens > 0
    drafts = counters.spec_decode_num_drafts
    return ServerStats(
        prompt_tokens=counters.prompt_tokens,
        generation_tokens=counters.generation_tokens,
        prefix_cache_queries=counters.prefix_cache_queries,
        prefix_cache_hits=counters.prefix_cache_hits,
        prefix_cache_hit_rate=rate(counters.prefix_cache_hits, counters.prefix_cache_queries),
        external_prefix_cache_queries=counters.external_prefix_cache_queries,
        external_prefix_cache_hits=counters.external_prefix_cache_hits,
        external_prefix_cache_hit_rate=rate(
            counters.external_prefix_cache_hits, counters.external_prefix_cache_queries
        ),
        preemptions=counters.num_preemptions,
        peak_kv_cache_usage=replay.peak_kv_usage,
        peak_running=replay.peak_running,
        peak_waiting=replay.peak_waiting,
        spec_decode_drafts=drafts if spec else None,
        spec_decode_draft_tokens=counters.spec_decode_num_draft_tokens if spec else None,
        spec_decode_accepted_tokens=counters.spec_decode_num_accepted_tokens if spec else None,
        spec_decode_acceptance_rate=(
            rate(counters.spec_decode_num_accepted_tokens, counters.spec_decode_num_draft_tokens)
            if spec
            else None
        ),
        spec_decode_mean_acceptance_length=(
            1 + counters.spec_decode_num_accepted_tokens / drafts if spec and drafts else None
        ),
        spec_decode_acceptance_per_position=(
            tuple(accepted / drafts for accepted in counters.spec_decode_accepted_per_pos)
            if spec and drafts
            else None
        ),
        kv_cache_tokens=memory.kv_cache_tokens,
        block_size=memory.block_size,
    )


def predict(
    config: SimConfig,
    plan: WorkloadPlan,
    load: LoadSpec,
    *,
    slo: RequestSlo | None = None,
    seed: int = 0,
    noise: float = 0.0,
    renderer: PromptRenderer | None = None,
    calibration: CalibrationProfile | None = None,
    shared: SharedRuns | None = None,
) -> Prediction:
    """Predict what replaying ``plan`` under ``load`` against ``config`` would measure.

    ``renderer``: the prompt renderer to use; by default one kept per plan (the
    last few plans), so repeated predictions of a plan (a study, a sweep)
    tokenize its prompts once. ``calibration``: a profile whose speed constants
    replace the defaults (its expected error is reported); InputError if it was
    fitted for another GPU or model. ``shared``: replays kept for other KV pool sizes
    (by default this process's): a kept replay that this config's pool would not have
    bounded answers it without a replay. Raises InputError for a configuration the
    simulated vLLM rejects outright.
    """
    constants, expected_error = profile_constants(calibration, config)
    acceptance = _acceptance(config, constants, plan)
    engine = SimEngineCore(
        config, seed=seed, noise=noise, constants=constants, mtp_acceptance=acceptance
    )
    memory = engine.memory
    if not memory.fits:
        failure = Failure(
            failure_class=FailureClass(memory.failure_class),
            message=(memory.failure_message or "").splitlines()[0],
            log_excerpt=memory.failure_message or "",
        )
        return Prediction(
            records=[],
            stats=compute_stats([], duration_s=0.0, slo=slo),
            server_stats=ServerStats(),
            memory=memory,
            startup=None,
            failure=failure,
            expected_error=expected_error,
        )
    plan_key = (plan.name, plan.digest, plan.token_space, len(plan.requests))
    shared = process_shared_runs() if shared is None else shared
    key = run_key(engine, (plan_key, load, slo, seed, noise, acceptance, expected_error))
    found = shared.find(key, engine, startup_report(memory))
    if found is not None:
        return found
    prediction = _replay(engine, plan, load, slo, renderer or plan_renderer(plan))
    prediction.expected_error = expected_error
    shared.keep(key, engine, prediction)
    return prediction


def _replay(
    engine: SimEngineCore,
    plan: WorkloadPlan,
    load: LoadSpec,
    slo: RequestSlo | None,
    renderer: PromptRenderer,
) -> Prediction:
    """The replay itself: ``plan`` under ``load`` through ``engine``."""
    memory = engine.memory
    replay = VirtualReplay(engine, plan, load, renderer)
    oom = replay.run()
    if oom is not None:
        return Prediction(
            records=[],
            stats=compute_stats([], duration_s=0.0, slo=slo),
            server_stats=_server_stats(engine.counters, memory, replay),
            memory=memory,
            startup=startup_report(memory),
            failure=Failure(
                failure_class=FailureClass.CUDA_OOM_LOAD,
                message=oom,
                log_excerpt=oom,
                seconds=engine.clock_s,
            ),
        )
    records = sorted(replay.records, key=lambda record: record.send_s)
    stats = compute_stats(
        records,
        duration_s=replay.window_duration_s(),
        slo=slo,
        itl=replay.itl,
        stopped_early=replay.stop_reason,
    )
    return Prediction(
        records=records,
        stats=stats,
        server_stats=_server_stats(engine.counters, memory, replay),
        memory=memory,
        startup=startup_report(memory),
        failure=None,
        progress=replay.progress,
    )
