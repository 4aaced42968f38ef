"""Each config's constants for the screen's queue, from the replay's own models."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.sim.model.calibration_profile import CalibrationProfile, profile_constants
from autotune.sim.model.config import SimConfig
from autotune.sim.model.kv_cache import CACHE_UNIT_MIN_TOKENS
from autotune.sim.model.memory import MemoryReport
from autotune.sim.model.scheduler import ACCEPTANCE_DECAY
from autotune.sim.model.timing import DecodeSteps, RooflineTimeModel, StepShape
from autotune.sim.virtual.screen.traffic import Traffic

# The decode batches whose step time is computed (the queue interpolates between them).
BATCH_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
FAR_CONTEXT_TOKENS = 32768.0  # where a chunk's attention cost per query-key pair is read
AMPLE_POOL_TOKENS = 1e15  # a pool that never binds, as the queue sees it


@dataclass(frozen=True)
class StepCosts:
    """A config's step times: a prefill chunk's (fixed, per token, per query-key pair) and
    a decode step's at each batch of ``BATCH_LADDER``. Configs that differ only in their
    KV pool share them."""

    chunk_fixed_s: float
    chunk_token_s: float
    chunk_pair_s: float
    decode_s: np.ndarray


@dataclass(frozen=True)
class ConfigTerms:
    """What the queue needs of one config."""

    memory: MemoryReport
    seats: float  # max-num-seqs
    chunk: float  # prefill tokens per step (max-num-batched-tokens)
    tokens_per_step: float  # per decoding request per step (1 + expected accepted drafts)
    costs: StepCosts
    pool_tokens: float  # KV tokens of the pool
    block_tokens: float  # a block's tokens (a request holds whole blocks)
    state_tokens: float  # a running request's state blocks (hybrid models), in tokens
    host_store: bool  # LMCache keeps evicted prefixes in host memory
    load_token_s: float  # PCIe seconds per token loaded back from the host store
    caching: bool  # prefix caching on
    unit_tokens: int  # a prefix-cache entry's tokens


def expected_tokens_per_step(rates: Sequence[float], num_drafts: int) -> float:
    """1 + the expected accepted drafts of a decode step: the per-position (unconditional)
    rates, extended past the list by ``ACCEPTANCE_DECAY`` as the scheduler extends them."""
    rates = list(rates)
    while len(rates) < num_drafts:
        rates.append((rates[-1] if rates else 0.5) * ACCEPTANCE_DECAY)
    return 1.0 + sum(min(1.0, rate) for rate in rates[:num_drafts])


def config_terms(
    config: SimConfig,
    memory: MemoryReport,
    traffic: Traffic,
    calibration: CalibrationProfile | None,
    acceptance: Sequence[float],
    costs_by_key: dict[tuple, StepCosts],
) -> ConfigTerms:
    """``config``'s terms; ``costs_by_key`` keeps step costs for the configs that follow."""
    constants, _ = profile_constants(calibration, config)
    k = memory.num_speculative_tokens
    rates = config.mtp_acceptance or constants.mtp_acceptance or acceptance
    most = min(memory.max_num_seqs, max(1, len(traffic.prompt)))
    key = (
        config.hardware,
        config.model,
        id(constants),
        config.enforce_eager,
        memory.tensor_parallel_size,
        tuple(memory.cudagraph_capture_sizes),
        memory.attention_bytes_per_token,
        memory.state_bytes_per_request,
        k,
        memory.max_num_batched_tokens,
        most,
    )
    costs = costs_by_key.get(key)
    if costs is None:
        costs = costs_by_key[key] = _step_costs(config, memory, traffic, constants, most)
    block_tokens = memory.block_size
    groups = max(1, memory.num_attention_groups)
    pool_blocks = max(memory.num_gpu_blocks - 1, 0)  # one null block
    return ConfigTerms(
        memory=memory,
        seats=float(memory.max_num_seqs),
        chunk=float(memory.max_num_batched_tokens),
        tokens_per_step=expected_tokens_per_step(rates, k) if k else 1.0,
        costs=costs,
        pool_tokens=pool_blocks / groups * block_tokens,
        block_tokens=float(block_tokens),
        state_tokens=memory.state_blocks_per_request / groups * block_tokens,
        host_store=config.lmcache,
        load_token_s=memory.attention_bytes_per_token / get_gpu(config.hardware).pcie_bytes_s,
        caching=bool(memory.enable_prefix_caching),
        unit_tokens=max(1, math.ceil(CACHE_UNIT_MIN_TOKENS / block_tokens)) * block_tokens,
    )


def _step_costs(
    config: SimConfig, memory: MemoryReport, traffic: Traffic, constants, most: int
) -> StepCosts:
    """The step-time model read at a chunk's sizes and at the decode ladder's batches."""
    time_model = RooflineTimeModel(
        get_gpu(config.hardware),
        get_model(config.model),
        memory,
        enforce_eager=config.enforce_eager,
        constants=constants,
    )
    context = float(np.mean(traffic.prompt + traffic.output / 2)) if len(traffic.prompt) else 1.0
    chunk = float(memory.max_num_batched_tokens)

    def prefill(tokens: float, position: float) -> float:
        return time_model.step_time_s(
            StepShape(
                num_seqs=1,
                num_prefill_tokens=int(tokens),
                num_decode_tokens=0,
                context_tokens=int(position),
                attention_pairs=tokens * (position + tokens / 2),
                num_logit_tokens=1,
            )
        )

    full = prefill(chunk, 0.0)
    small = prefill(1.0, 0.0)
    pair_s = max(0.0, (prefill(chunk, FAR_CONTEXT_TOKENS) - full) / (chunk * FAR_CONTEXT_TOKENS))
    token_s = max(0.0, (full - small) / max(1.0, chunk - 1))
    decode = np.empty(len(BATCH_LADDER))
    k = memory.num_speculative_tokens
    for index, batch in enumerate(BATCH_LADDER):  # the batches past ``most`` are never used
        if index and BATCH_LADDER[index - 1] >= most:
            decode[index:] = decode[index - 1]
            break
        steps = DecodeSteps(batch, k, np.array([int(batch * context)], dtype=np.int64))
        decode[index] = time_model.decode_times_s(steps)[0]
    return StepCosts(max(0.0, small - token_s), token_s, pair_s, decode)


def as_queued(terms: ConfigTerms, traffic: Traffic) -> ConfigTerms:
    """``terms`` as the queue sees them: seats past the requests ever in flight at once
    count as many as those, and a KV pool that holds every context the traffic can put in
    it at once (and every session's, for the LRU) as ``AMPLE_POOL_TOKENS``."""
    n = len(traffic.prompt)
    sessions = traffic.sessions
    in_flight = n if traffic.mode == "trace" else min(traffic.slots, sessions)
    seats = min(terms.seats, float(max(1, in_flight)))
    shared = traffic.shared_prefix if terms.caching else 0.0
    block = terms.block_tokens
    held = np.maximum(traffic.prompt + traffic.output - shared, 1.0)
    need = np.ceil(held / block) * block + terms.state_tokens
    at_once = float(np.sort(need)[::-1][: int(seats)].sum())
    if traffic.mode == "sessions":  # the LRU's reach: every session's largest context
        largest = np.zeros(max(1, sessions))
        np.maximum.at(largest, traffic.session, need)
        at_once = max(at_once, float(largest.sum()))
    working = min(traffic.slots, sessions) * float(np.mean(traffic.prompt)) if n else 0.0
    ample = (
        terms.pool_tokens - shared >= at_once
        and terms.pool_tokens >= working + seats * terms.state_tokens
    )
    return dataclasses.replace(
        terms, seats=seats, pool_tokens=AMPLE_POOL_TOKENS if ample else terms.pool_tokens
    )


def queue_key(terms: ConfigTerms) -> tuple:
    """What the queue reads of ``terms``: two configs with the same key queue alike."""
    return (
        terms.seats,
        terms.chunk,
        terms.tokens_per_step,
        id(terms.costs),
        terms.pool_tokens,
        terms.block_tokens,
        terms.state_tokens,
        terms.host_store,
        terms.load_token_s,
        terms.caching,
        terms.unit_tokens,
    )
