"""The screen: every config of a lattice scored at once from the workload's statistics.

The replay (``predict.py``) steps the scheduler through every request of the
workload, tens of milliseconds a config; the screen answers the same question in
well under a millisecond a config, so that a lattice of thousands is scored whole
and the replay judges only the short list the screen ranks at the top
(``autotune/tuner/two_tier.py``). It uses the replay's own parts: the memory plan
(``plan_memory``: KV blocks, seats, run-time headroom), the step-cost model
(``RooflineTimeModel``: decode steps by batch, prefill chunks by size), MTP
acceptance (the same per-position rates) and chunked prefill (a prompt's uncached
tokens in chunks of ``max-num-batched-tokens``); what it drops is the step-by-step
schedule. In its place, a request-level queue in modelled time, computed for a
block of configs at once as numpy arrays, request after request in plan order:

- a request is ready when its session's earlier requests (its ``after``) are done plus
  its gap (the load policy's ``wait_s``), or at its arrival (trace), or when a slot is
  free (concurrency); sessions take the ``concurrency`` slots in order;
- it takes a seat (``max-num-seqs``, or fewer when the KV pool holds fewer contexts);
- its uncached prompt (what an unbounded prefix cache would not hold, plus the share
  of the reusable prefix the pool loses to pressure; LMCache loads that share over
  PCIe instead) queues for the prefill: one chunk per step, first come first served;
- then it decodes its output at the batch's step time over the tokens an MTP step
  yields; the batch is the mean number decoding (Little's law over the last pass).
  (Slowing the decoders in the steps that carry a chunk, as the replay does, made the
  ranking worse: rank correlation 0.93 -> 0.69 on the README's lattice.)

The first pass takes the requests in plan order; later passes take each config's in the
order the last pass made them ready, and settle the batch and the sessions' starts. The
figures are a ranking, not a measurement: ``scripts/bench_screen.py`` measures
their rank correlation with the replay and whether the replay's best is inside the
screen's short list, on every landscape of the tuner's benchmark and GPU of the plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.replay.load import LoadSpec, RequestSlo
from autotune.replay.load_policy import LoadPolicy, sessions_in_order
from autotune.replay.records import Percentiles, ReplayStats
from autotune.sim.model.calibration_profile import CalibrationProfile, profile_constants
from autotune.sim.model.config import SimConfig
from autotune.sim.model.kv_cache import CACHE_UNIT_MIN_TOKENS
from autotune.sim.model.memory import MemoryReport, plan_memory
from autotune.sim.model.prompt import PromptRenderer
from autotune.sim.model.scheduler import ACCEPTANCE_DECAY
from autotune.sim.model.timing import DecodeSteps, RooflineTimeModel, StepShape
from autotune.vocabulary import FailureClass
from autotune.workload.plan import WorkloadPlan

PASSES = 4  # fixed-point passes over the workload (batch, prefill share, session starts)
BLOCK = 512  # configs computed together (arrays of BLOCK x requests stay small)
KEEP_EXPONENT = 0.4  # LRU keeps more of a returning prefix than the pool's share (measured)
_DEBUG: dict = {}
import os
WASTE = float(os.environ.get("WASTE", "1"))
BATCH_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True)
class Traffic:
    """The workload as the screen reads it: one entry per request, in send order of the
    plan (every ``after`` is earlier)."""

    prompt: np.ndarray  # prompt tokens
    output: np.ndarray  # output tokens
    wait: np.ndarray  # seconds after its dependencies end (sessions) or its arrival (trace)
    parents: tuple[tuple[int, ...], ...]  # the requests it waits for
    session: np.ndarray  # index of its session (order of first request)
    mode: str  # the load mode
    slots: int  # concurrency: sessions (or requests) in flight at once
    renderer: PromptRenderer
    plan: WorkloadPlan
    _reuse: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def sessions(self) -> int:
        return int(self.session.max()) + 1 if len(self.session) else 0

    def reuse(self, unit_tokens: int) -> np.ndarray:
        """Per request, the prompt tokens an unbounded prefix cache would hold when it is
        sent (whole cache units of earlier requests' prompts, as the scheduler looks them
        up: never the prompt's last token)."""
        found = self._reuse.get(unit_tokens)
        if found is None:
            seen: set[int] = set()
            hits = np.zeros(len(self.prompt))
            for index, request in enumerate(self.plan.requests[: len(self.prompt)]):
                hashes = self.renderer.planned_hashes(request, unit_tokens, salt=None)
                most = (len(self.renderer.planned_array(request)) - 1) // unit_tokens
                count = 0
                for block_hash in hashes[:most]:
                    if block_hash not in seen:
                        break
                    count += 1
                hits[index] = count * unit_tokens
                seen.update(hashes)
            found = self._reuse[unit_tokens] = hits
        return found

    @property
    def shared_prefix(self) -> float:
        """Prompt tokens every session starts with (a system prompt), at the finest unit."""
        firsts = [i for i, parents in enumerate(self.parents) if not parents]
        if len(firsts) < 2:
            return 0.0
        return float(np.median(self.reuse(CACHE_UNIT_MIN_TOKENS)[firsts[1:]]))


def read_traffic(plan: WorkloadPlan, load: LoadSpec, renderer: PromptRenderer) -> Traffic:
    """The screen's view of ``plan`` replayed under ``load`` (``max_requests`` honoured)."""
    requests = list(plan.requests)
    if load.max_requests is not None:
        requests = requests[: load.max_requests]
    index = {request.id: i for i, request in enumerate(requests)}
    groups = sessions_in_order(requests)
    session_of = {request.id: s for s, group in enumerate(groups) for request in group}
    policy = LoadPolicy(plan, load.model_copy(update={"mode": "trace"}))  # its wait_s
    parents: list[tuple[int, ...]] = []
    wait = np.zeros(len(requests))
    if load.mode == "trace":
        previous = requests[0].arrival_s if requests else 0.0
        at_s = 0.0
        ordered = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        for i in ordered:
            at_s += policy.wait_s(requests[i].arrival_s - previous)
            previous = requests[i].arrival_s
            wait[i] = at_s
    for i, request in enumerate(requests):
        if load.mode == "sessions":
            parents.append(tuple(index[d] for d in request.after if d in index))
            wait[i] = policy.wait_s(request.gap_s)
        else:
            parents.append(())
    session = (
        np.arange(len(requests))
        if load.mode == "concurrency"
        else np.array([session_of[r.id] for r in requests], dtype=np.int64)
    )
    return Traffic(
        prompt=np.array([len(renderer.planned_array(r)) for r in requests], dtype=np.float64),
        output=np.array([max(1, r.output_tokens) for r in requests], dtype=np.float64),
        wait=wait,
        parents=tuple(parents),
        session=session,
        mode=load.mode,
        slots=load.concurrency,
        renderer=renderer,
        plan=plan,
    )


@dataclass(frozen=True)
class Screened:
    """What the screen says of one config: its memory plan and either a failure class
    (it cannot start, or a surely-reached prefill outgrows its headroom) or its figures."""

    memory: MemoryReport
    failure: FailureClass | None
    stats: ReplayStats | None


@dataclass
class _Terms:
    """One config's constants for the queue, from the replay's own models."""

    memory: MemoryReport
    seats: float
    chunk: float  # prefill tokens per step
    tokens_per_step: float  # per decoding request per step (1 + expected accepted drafts)
    chunk_fixed_s: float  # a prefill chunk's step time: fixed part
    chunk_token_s: float  # ... per prompt token
    chunk_pair_s: float  # ... per query-key pair
    decode_s: np.ndarray  # decode step time at each batch of BATCH_LADDER (clipped)
    pool_tokens: float  # KV tokens of the pool
    block_tokens: float  # a block's tokens (a request holds whole blocks)
    state_tokens: float  # a running request's state blocks (hybrid models), in tokens
    host_store: bool
    load_token_s: float  # PCIe seconds per external (LMCache) token
    caching: bool
    unit_tokens: int


def expected_tokens_per_step(rates: Sequence[float], num_drafts: int) -> float:
    """1 + the expected accepted drafts of a decode step: the per-position (unconditional)
    rates, extended past the list by ``ACCEPTANCE_DECAY`` as the scheduler extends them."""
    rates = list(rates)
    while len(rates) < num_drafts:
        rates.append((rates[-1] if rates else 0.5) * ACCEPTANCE_DECAY)
    return 1.0 + sum(min(1.0, rate) for rate in rates[:num_drafts])


def _terms(
    config: SimConfig,
    memory: MemoryReport,
    traffic: Traffic,
    calibration: CalibrationProfile | None,
    acceptance: Sequence[float],
) -> _Terms:
    constants, _ = profile_constants(calibration, config)
    gpu, model = get_gpu(config.hardware), get_model(config.model)
    time_model = RooflineTimeModel(
        gpu, model, memory, enforce_eager=config.enforce_eager, constants=constants
    )
    k = memory.num_speculative_tokens
    rates = config.mtp_acceptance or constants.mtp_acceptance or acceptance
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
    far = 32768.0
    pair_s = max(0.0, (prefill(chunk, far) - full) / (chunk * far))
    token_s = max(0.0, (full - small) / max(1.0, chunk - 1))
    most = min(memory.max_num_seqs, max(1, len(traffic.prompt)))
    decode = np.empty(len(BATCH_LADDER))
    for index, batch in enumerate(BATCH_LADDER):  # the batches past ``most`` are never used
        if index and BATCH_LADDER[index - 1] >= most:
            decode[index:] = decode[index - 1]
            break
        steps = DecodeSteps(batch, k, np.array([int(batch * context)], dtype=np.int64))
        decode[index] = time_model.decode_times_s(steps)[0]
    block_tokens = memory.block_size
    groups = max(1, memory.num_attention_groups)
    state_tokens = memory.state_blocks_per_request / groups * block_tokens
    shared = traffic.shared_prefix  # held once, however many requests read it
    blocks_per_request = (
        math.ceil(max(context - shared, block_tokens) / block_tokens) * groups
        + memory.state_blocks_per_request
    )
    pool_blocks = max(memory.num_gpu_blocks - 1, 0)
    kv_seats = max(1.0, (pool_blocks - shared / block_tokens * groups) / max(1, blocks_per_request))
    unit = max(1, math.ceil(CACHE_UNIT_MIN_TOKENS / block_tokens)) * block_tokens
    return _Terms(
        memory=memory,
        seats=float(memory.max_num_seqs),
        chunk=chunk,
        tokens_per_step=expected_tokens_per_step(rates, k) if k else 1.0,
        chunk_fixed_s=max(0.0, small - token_s),
        chunk_token_s=token_s,
        chunk_pair_s=pair_s,
        decode_s=decode,
        pool_tokens=pool_blocks / groups * block_tokens,
        block_tokens=float(block_tokens),
        state_tokens=state_tokens,
        host_store=config.lmcache,
        load_token_s=memory.attention_bytes_per_token / gpu.pcie_bytes_s,
        caching=memory.enable_prefix_caching,
        unit_tokens=unit,
    )


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
    """The screen's figures for every config, in order (see the module docstring)."""
    traffic = read_traffic(plan, load, renderer or PromptRenderer())
    results: list[Screened | None] = [None] * len(configs)
    runnable: list[tuple[int, _Terms]] = []
    for index, config in enumerate(configs):
        memory = plan_memory(config)
        if not memory.fits:
            results[index] = Screened(memory, FailureClass(memory.failure_class), None)
            continue
        runnable.append((index, _terms(config, memory, traffic, calibration, acceptance)))
    for start in range(0, len(runnable), BLOCK):
        block = runnable[start : start + BLOCK]
        queued = _queue([terms for _, terms in block], traffic, slo)
        for (index, terms), (stats, running, step_tokens) in zip(block, queued, strict=True):
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


def _queue(
    terms: list[_Terms], traffic: Traffic, slo: RequestSlo | None
) -> list[tuple[ReplayStats, float, float]]:
    """The request-level queue of the module docstring for a block of configs at once: per
    config its figures, the most requests running at once and the largest step (tokens)."""
    n = len(traffic.prompt)
    count = len(terms)
    col = lambda name: np.array([getattr(t, name) for t in terms], dtype=np.float64)  # noqa: E731
    seats, chunk, per_step = col("seats"), col("chunk"), col("tokens_per_step")
    fixed_s, token_s, pair_s = col("chunk_fixed_s"), col("chunk_token_s"), col("chunk_pair_s")
    pool, state, block = col("pool_tokens"), col("state_tokens"), col("block_tokens")
    host = np.array([t.host_store for t in terms])
    caching = np.array([t.caching for t in terms])
    load_s = col("load_token_s")
    decode_table = np.array([t.decode_s for t in terms])
    ladder = np.array(BATCH_LADDER, dtype=np.float64)
    reuse = np.array([traffic.reuse(t.unit_tokens) for t in terms])  # count x n
    prompt, output = traffic.prompt[None, :], traffic.output[None, :]
    sessions = traffic.sessions
    active = float(min(traffic.slots, sessions)) if traffic.mode != "trace" else float(sessions)
    in_flight = n if traffic.mode == "trace" else int(active)  # at most this many at once
    max_seats = int(min(max(seats.max(initial=1.0), 1.0), n or 1, max(1, in_flight)))
    seat_order = np.arange(max_seats)[None, :]
    rows = np.arange(count)
    # The KV a request holds while it runs: its context past the shared prefix (held once),
    # in whole blocks, and its state; at most the pool (one such request runs alone).
    shared = np.where(caching, traffic.shared_prefix, 0.0)[:, None]
    held = np.maximum(prompt + output - shared, 1.0)
    capacity = np.maximum(pool - shared[:, 0], block)  # what the requests' own contexts share
    need = np.ceil(held / block[:, None]) * block[:, None] + state[:, None]
    need = np.minimum(need, capacity[:, None])
    own = np.maximum(reuse - shared, 0.0)  # a request's reusable prefix past the shared one
    parent = np.array([max(p) if p else -1 for p in traffic.parents], dtype=np.int64)
    most = max((len(p) for p in traffic.parents), default=0)
    parents = np.full((n, max(most, 1)), -1, dtype=np.int64)
    for i, found in enumerate(traffic.parents):
        parents[i, : len(found)] = found
    has_parent = parents[:, 0] >= 0
    kids: list[list[int]] = [[] for _ in range(n)]
    for i, found in enumerate(traffic.parents):
        for p in found:
            kids[p].append(i)
    children = np.full((n, max(1, max((len(c) for c in kids), default=0))), -1, dtype=np.int64)
    for i, found in enumerate(kids):
        children[i, : len(found)] = found

    batch = np.minimum(seats, max(1.0, active / 2))
    timeline: tuple[np.ndarray, ...] | None = None  # the last pass's prefills and waits
    working = active * float(np.mean(traffic.prompt)) if n else 1.0
    session_start = np.zeros((count, sessions))
    trace = traffic.mode == "trace"
    plan_order = np.argsort(traffic.wait, kind="stable") if trace else np.arange(n)
    ready_at: np.ndarray | None = None  # each request's readiness, once a pass has run
    admitted: np.ndarray | None = None  # ... its admission (the last pass's)
    finish = np.zeros((count, n))
    for _ in range(PASSES):
        if admitted is None:
            # No timeline yet: the share of the reusable prefixes the pool keeps, from the
            # sessions in flight each holding their context.
            need_all = working + np.minimum(batch, seats) * state
            kept = np.clip(pool / need_all, 0.0, 1.0) ** KEEP_EXPONENT
            local = np.minimum(reuse, shared) + own * kept[:, None]
        else:
            local = np.minimum(reuse, shared) + _kept(traffic, parent, own, need, capacity, admitted, finish)
        local = np.where(caching[:, None], local, 0.0)
        external = np.where(host[:, None], reuse - local, 0.0)
        uncached = np.maximum(prompt - local - external, 1.0)
        chunks = np.ceil(uncached / chunk[:, None])
        prefill_s = (
            chunks * fixed_s[:, None]
            + uncached * token_s[:, None]
            + pair_s[:, None] * uncached * (local + external + uncached / 2)
            + external * load_s[:, None]
        )
        step_s = _interp_rows(batch, ladder, decode_table)
        # A prefill chunk's step carries the decoding batch beside it.
        prefill_s += chunks * np.maximum(step_s - decode_table[:, 0], 0.0)[:, None]
        steps_needed = np.maximum(output - 1.0, 0.0) / per_step[:, None]
        full_chunk_s = fixed_s + chunk * token_s + np.maximum(step_s - decode_table[:, 0], 0.0)
        pace = _Pace.idle(step_s) if timeline is None else _Pace.build(*timeline, full_chunk_s, step_s)
        finish = np.zeros((count, n))
        first_token = np.zeros((count, n))
        seated_at = np.zeros((count, n))
        seat_ready = np.zeros((count, n))  # when a seat was free (before room in the pool)
        begun_at = np.zeros((count, n))  # its prefill's start
        seat_free = np.where(seat_order < np.floor(seats)[:, None], 0.0, np.inf)
        seat_kv = np.zeros((count, max_seats))
        prefill_free = np.zeros(count)
        last_start = np.zeros(count)
        slot_free = np.zeros((count, max(1, traffic.slots)))
        sessions_mode = traffic.mode == "sessions"
        ready_at = np.zeros((count, n))
        if sessions_mode:  # taken in order of readiness, known once the parents are done
            known = np.where(has_parent[None, :], np.inf, 0.0)
            known = known + np.where(has_parent[None, :], 0.0, session_start[:, traffic.session] + traffic.wait[None, :])
            pending = np.broadcast_to((parents >= 0).sum(axis=1), (count, n)).copy()
            parent_end = np.full((count, n), -np.inf)
        in_order = trace or sessions_mode
        for k in range(n):
            if sessions_mode:
                col = np.argmin(known, axis=1)
                ready = known[rows, col]
                known[rows, col] = np.inf
            else:
                col = np.full(count, plan_order[k])
                ready = _ready(traffic, int(plan_order[k]), finish, session_start, slot_free)
            ready_at[rows, col] = ready
            # First come, first served: a seat, then room in the pool for its context.
            start = np.maximum(ready, seat_free.min(axis=1))
            if in_order:  # requests taken in order of readiness: first come, first served
                start = np.maximum(start, last_start)
            seat_ready[rows, col] = start
            start = _room(start, seat_free, seat_kv, need[rows, col], capacity)
            last_start = start
            j = np.argmin(seat_free, axis=1)
            seated_at[rows, col] = start
            begin = np.maximum(start, prefill_free)
            begun_at[rows, col] = begin
            prefill_free = begin + prefill_s[rows, col]
            first_token[rows, col] = prefill_free
            done = pace.time_at(pace.steps_at(prefill_free) + steps_needed[rows, col])
            done = np.maximum(done, prefill_free)
            finish[rows, col] = done
            seat_free[rows, j] = done
            seat_kv[rows, j] = need[rows, col]
            if traffic.mode == "concurrency":
                slot_free[rows, np.argmax(np.isinf(slot_free), axis=1)] = done
            if sessions_mode:  # its children are ready once their last parent is done
                for child in children[col].T:
                    has = child >= 0
                    at = np.where(has, child, 0)
                    parent_end[rows, at] = np.where(has, np.maximum(parent_end[rows, at], done), parent_end[rows, at])
                    pending[rows, at] -= has
                    now = has & (pending[rows, at] == 0)
                    known[rows, at] = np.where(now, parent_end[rows, at] + traffic.wait[at], known[rows, at])
        admitted = seated_at
        window = np.maximum(finish.max(axis=1, initial=0.0), 1e-9)
        decoding = (finish - first_token).sum(axis=1)
        batch = np.clip(decoding / window, 1.0, np.maximum(seats, 1.0))
        # Each decode's share of steps that carry a chunk: another request's prefill, or one
        # that waits for room in the pool (vLLM admits it, preempts it, admits it again).
        # The last pass's timeline: each prefill (its chunks) and each wait for room in the
        # pool (vLLM admits the waiting request, preempts it, admits it again: chunk steps).
        previous = np.concatenate([np.zeros((count, 1)), np.sort(seated_at, axis=1)[:, :-1]], axis=1)
        rank = np.argsort(np.argsort(seated_at, axis=1, kind="stable"), axis=1, kind="stable")
        waiting_from = np.minimum(np.maximum(seat_ready, previous[rows[:, None], rank]), seated_at)
        if WASTE == 0:
            waiting_from = seated_at
        timeline = (begun_at, first_token, chunks, waiting_from, seated_at)
        ttft = first_token - ready_at
        e2e = finish - ready_at
        if traffic.mode == "sessions":  # the next pass's readiness, from this one's ends
            session_start = _session_starts(traffic, ready_at, finish)
    _DEBUG.update(local=local, external=external, uncached=uncached, prefill_s=prefill_s, step_s=step_s, batch=batch, window=window, seated=seated_at, finish=finish, first=first_token, ready=ready_at)
    tpot = np.where(output > 1, (finish - first_token) / np.maximum(output - 1, 1), np.nan)
    itl = np.repeat((step_s / per_step)[:, None], n, axis=1)
    running = _peak_running(seated_at, finish)
    step_tokens = np.minimum(chunk, uncached.max(axis=1, initial=1.0) + running * per_step)
    figures = _figures(window, ttft, tpot, itl, e2e, traffic, slo)
    return [(figures[c], running[c], step_tokens[c]) for c in range(count)]


def _room(
    start: np.ndarray, seat_free: np.ndarray, seat_kv: np.ndarray, need: np.ndarray, pool: np.ndarray
) -> np.ndarray:
    """Per config, the earliest time from ``start`` at which the pool holds ``need`` more
    tokens beside the running requests' (each seat's until it frees)."""
    order = np.argsort(seat_free, axis=1)
    free_at = np.take_along_axis(seat_free, order, axis=1)
    kv = np.take_along_axis(seat_kv, order, axis=1)
    kv = np.where(np.isfinite(free_at), kv, 0.0)
    running = np.where(free_at > start[:, None], kv, 0.0)
    # after the i-th seat (in order of freeing) frees: what the later ones still hold
    held_after = running.sum(axis=1, keepdims=True) - np.cumsum(running, axis=1)
    times = np.concatenate([start[:, None], np.maximum(start[:, None], free_at)], axis=1)
    used = np.concatenate([running.sum(axis=1, keepdims=True), held_after], axis=1)
    fits = used + need[:, None] <= pool[:, None] + 1e-6
    fits[:, -1] = True
    first = np.argmax(fits, axis=1)
    found = times[np.arange(len(start)), first]
    return np.where(np.isfinite(found), found, start)


@dataclass
class _Pace:
    """Per config, the decode steps a running request has made by each time: a decode
    step takes ``idle_step_s`` alone and one chunk's step beside a prefill (or a request
    that vLLM admits and preempts while it waits for room), from the last pass's timeline."""

    times: np.ndarray  # count x m, ascending
    steps: np.ndarray  # count x m, steps made by each time
    idle_step_s: np.ndarray  # count

    @classmethod
    def idle(cls, step_s: np.ndarray) -> _Pace:
        zeros = np.zeros((len(step_s), 1))
        return cls(zeros, zeros.copy(), step_s)

    @classmethod
    def build(
        cls,
        prefill_from: np.ndarray,
        prefill_to: np.ndarray,
        chunks: np.ndarray,
        wait_from: np.ndarray,
        wait_to: np.ndarray,
        full_chunk_s: np.ndarray,
        step_s: np.ndarray,
    ) -> _Pace:
        count, n = prefill_from.shape
        rate = chunks / np.maximum(prefill_to - prefill_from, 1e-9)  # chunk steps a second
        times = np.concatenate([prefill_from, prefill_to, wait_from, wait_to], axis=1)
        rate_delta = np.concatenate([rate, -rate, np.zeros((count, 2 * n))], axis=1)
        wait_delta = np.concatenate([np.zeros((count, 2 * n)), np.ones((count, n)), -np.ones((count, n))], axis=1)
        order = np.argsort(times, axis=1, kind="stable")
        times = np.take_along_axis(times, order, axis=1)
        prefill_rate = np.cumsum(np.take_along_axis(rate_delta, order, axis=1), axis=1)
        waiting = np.cumsum(np.take_along_axis(wait_delta, order, axis=1), axis=1) > 0.5
        slope = np.where(
            prefill_rate > 1e-12,
            prefill_rate,
            np.where(waiting, 1.0 / full_chunk_s[:, None], 1.0 / step_s[:, None]),
        )
        span = np.diff(times, axis=1, prepend=0.0)
        before = np.concatenate([1.0 / step_s[:, None], slope[:, :-1]], axis=1)  # each span's
        steps = np.cumsum(span * before, axis=1)
        return cls(times, steps, step_s)

    def steps_at(self, at: np.ndarray) -> np.ndarray:
        return self._lookup(self.times, self.steps, at, 1.0 / self.idle_step_s)

    def time_at(self, steps: np.ndarray) -> np.ndarray:
        return self._lookup(self.steps, self.times, steps, self.idle_step_s)

    @staticmethod
    def _lookup(xs: np.ndarray, ys: np.ndarray, x: np.ndarray, past: np.ndarray) -> np.ndarray:
        """Per row, ``ys`` at ``x`` (linear between the points; at slope ``past`` after)."""
        count, m = xs.shape
        span = float(max(np.abs(xs).max(initial=0.0), np.abs(x).max(initial=0.0), 1.0)) * 4 + 1
        offset = np.arange(count) * span
        index = np.searchsorted((xs + offset[:, None]).ravel(), x + offset, side="right")
        index = index - np.arange(count) * m  # points at or before x
        rows = np.arange(count)
        low = np.clip(index - 1, 0, m - 1)
        high = np.clip(index, 0, m - 1)
        x0, x1, y0, y1 = xs[rows, low], xs[rows, high], ys[rows, low], ys[rows, high]
        inside = (index > 0) & (index < m) & (x1 > x0)
        between = y0 + (x - x0) * np.where(inside, (y1 - y0) / np.where(inside, x1 - x0, 1.0), 0.0)
        after = ys[:, -1] + (x - xs[:, -1]) * past
        before = ys[:, 0] - (xs[:, 0] - x) * past
        return np.where(index >= m, after, np.where(index <= 0, before, between))


def _overlap(starts: np.ndarray, ends: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Per row and column i, how much of the row's intervals ``starts``-``ends`` (disjoint)
    lies within ``low[i]``-``high[i]``."""
    count, n = starts.shape
    if not n:
        return np.zeros_like(low)
    order = np.argsort(starts, axis=1)
    begin = np.take_along_axis(starts, order, axis=1)
    length = np.maximum(np.take_along_axis(ends, order, axis=1) - begin, 0.0)
    done = np.concatenate([np.zeros((count, 1)), np.cumsum(length, axis=1)], axis=1)
    span = float(max(np.nanmax(np.abs(begin)), np.nanmax(np.abs(high)), 1.0)) * 4 + 1
    offset = (np.arange(count) * span)[:, None]

    def until(t: np.ndarray) -> np.ndarray:
        index = np.searchsorted((begin + offset).ravel(), (t + offset).ravel(), side="right")
        index = index.reshape(t.shape) - np.arange(count)[:, None] * n
        last = np.clip(index - 1, 0, n - 1)
        rows = np.arange(count)[:, None]
        inside = np.clip(t - begin[rows, last], 0.0, length[rows, last])
        return np.where(index > 0, done[rows, last] + inside, 0.0)

    return np.maximum(until(high) - until(low), 0.0)


def _kept(
    traffic: Traffic,
    parent: np.ndarray,
    own: np.ndarray,
    need: np.ndarray,
    capacity: np.ndarray,
    admitted: np.ndarray,
    finish: np.ndarray,
) -> np.ndarray:
    """Per config and request, the tokens of its own reusable prefix (past the shared one)
    the pool still holds when it is admitted, from the last pass's timeline: its session's
    last request left its prompt cached, and the least recently used blocks go first, so it
    keeps what the contexts other sessions touched since leave of ``capacity``."""
    count, n = own.shape
    kept = own.copy()
    session = traffic.session
    by_session = [np.flatnonzero(session == s) for s in range(traffic.sessions)]
    for k in np.flatnonzero(parent >= 0):
        p = parent[k]
        since = finish[:, p]
        at = admitted[:, k]
        touched = np.zeros(count)
        for s, members in enumerate(by_session):
            if s == session[k] or not len(members):
                continue
            begun = admitted[:, members] < at[:, None]
            latest = np.where(begun, np.arange(len(members))[None, :], -1).max(axis=1)
            has = latest >= 0
            q = members[np.maximum(latest, 0)]
            active = has & (finish[np.arange(count), q] > since)
            touched += np.where(active, need[np.arange(count), q], 0.0)
        kept[:, k] = np.minimum(own[:, k], np.maximum(capacity - touched, 0.0))
    return kept


def _peak_running(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per config (row), the most requests between their ``start`` and ``end`` at once."""
    count, n = start.shape
    if not n:
        return np.zeros(count)
    times = np.concatenate([start, end], axis=1)
    steps = np.concatenate([np.ones((count, n)), -np.ones((count, n))], axis=1)
    order = np.lexsort((steps, times), axis=1)  # at equal times an end goes first
    return np.cumsum(np.take_along_axis(steps, order, axis=1), axis=1).max(axis=1)


def _ready(
    traffic: Traffic,
    i: int,
    finish: np.ndarray,
    session_start: np.ndarray,
    slot_free: np.ndarray,
) -> np.ndarray:
    """When request ``i`` can be sent, per config: its arrival (trace), its parents' end
    plus its gap, its session's start plus its gap, or a free slot (concurrency: the slot
    is then held until it ends)."""
    parents = traffic.parents[i]
    if traffic.mode == "trace":
        return np.full(finish.shape[0], traffic.wait[i])
    if parents:
        return finish[:, list(parents)].max(axis=1) + traffic.wait[i]
    if traffic.mode == "concurrency":
        rows = np.arange(finish.shape[0])
        j = np.argmin(slot_free, axis=1)
        ready = slot_free[rows, j].copy()
        slot_free[rows, j] = np.inf  # until the request ends
        return ready
    return session_start[:, int(traffic.session[i])] + traffic.wait[i]


def _session_starts(traffic: Traffic, ready_at: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """Each session's start: its slot among ``traffic.slots`` (the first free, in order),
    given the durations this pass gave them."""
    count, sessions = finish.shape[0], traffic.sessions
    starts = np.zeros((count, sessions))
    lengths = np.zeros((count, sessions))
    begun = np.full((count, sessions), np.inf)
    ended = np.zeros((count, sessions))
    for i in range(len(traffic.session)):
        s = int(traffic.session[i])
        begun[:, s] = np.minimum(begun[:, s], ready_at[:, i] - traffic.wait[i])
        ended[:, s] = np.maximum(ended[:, s], finish[:, i])
    lengths = ended - np.where(np.isfinite(begun), begun, 0.0)
    slots = np.zeros((count, max(1, traffic.slots)))
    rows = np.arange(count)
    for s in range(sessions):
        j = np.argmin(slots, axis=1)
        starts[:, s] = slots[rows, j]
        slots[rows, j] += lengths[:, s]
    return starts


def _interp_rows(x: np.ndarray, ladder: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Per row, ``table``'s value at ``x`` (linear between the ladder's batches)."""
    position = np.clip(np.searchsorted(ladder, x, side="right") - 1, 0, len(ladder) - 2)
    low, high = ladder[position], ladder[position + 1]
    weight = np.clip((x - low) / (high - low), 0.0, 1.0)
    rows = np.arange(len(x))
    return table[rows, position] * (1 - weight) + table[rows, position + 1] * weight


def _percentiles(values: np.ndarray) -> list[Percentiles]:
    """Mean and percentiles of each row (NaN: not measured, left out)."""
    if not values.shape[1]:
        return [Percentiles() for _ in range(values.shape[0])]
    with np.errstate(all="ignore"):
        mean = np.nanmean(values, axis=1)
        p50, p90, p95, p99 = np.nanpercentile(values, [50, 90, 95, 99], axis=1)
    return [
        Percentiles(mean=float(m), p50=float(a), p90=float(b), p95=float(c), p99=float(d))
        if np.isfinite(m)
        else Percentiles()
        for m, a, b, c, d in zip(mean, p50, p90, p95, p99, strict=True)
    ]


def _figures(
    window: np.ndarray,
    ttft: np.ndarray,
    tpot: np.ndarray,
    itl: np.ndarray,
    e2e: np.ndarray,
    traffic: Traffic,
    slo: RequestSlo | None,
) -> list[ReplayStats]:
    """Each config's figures as a replay's stats (one row of the arrays per config)."""
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
    columns = zip(
        _percentiles(ttft), _percentiles(tpot), _percentiles(itl), _percentiles(e2e), strict=True
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
