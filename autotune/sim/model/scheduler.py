"""The simulator's scheduler core: vLLM's continuous batching in virtual time.

One ``SimEngineCore`` is one engine: requests are added, ``step()`` runs one
iteration (chunked prefill within ``max_num_batched_tokens``, at most
``max_num_seqs`` running, decode with optional MTP drafts), allocates KV
blocks from the pool the memory plan sized, preempts by recompute when the
pool is full, and returns the tokens each request produced with the step's
modelled duration. The clock, RNGs and counters belong to the instance, so two
engines in one process never interact. Two faces drive it: the HTTP server
(sim/server/server.py) in wall time, and predict.py in pure virtual time.

MTP acceptance uses common random numbers: each request has its own stream,
seeded by the engine's seed and the request's id, and one draw per output
position; a draft at depth d that would become output position q is accepted
when that position's draw is below the depth's conditional rate (and every
shallower draft was). A request therefore meets the same draws under any
batching, KV size or acceptance rate, so two configs (or two acceptance
estimates) differ in throughput by what differs between them, not by a reshuffle
of one shared stream (which moved a prediction by 3% for a 0.1% change in
acceptance).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.errors import InputError
from autotune.sim.model.config import SimConfig
from autotune.sim.model.kv_cache import (
    CACHE_UNIT_MIN_TOKENS,
    KvCacheManager,
    RequestState,
    SimRequest,
)
from autotune.sim.model.memory import MemoryReport, plan_memory, torch_oom_text
from autotune.sim.model.speed_constants import SpeedConstants, gpu_constants
from autotune.sim.model.step_results import DecodeRun, EngineCounters, StepResult, TokenOutput
from autotune.sim.model.timing import (
    DecodeSteps,
    RooflineTimeModel,
    StepShape,
    StepTimeModel,
    decode_times_s,
)

MIN_NOISE_FACTOR = 0.05  # a noisy step never takes less than 5% of its modelled time
MAX_RUN_STEPS = 4096  # longest decode run computed at once by decode_run()
ACCEPTANCE_DECAY = 0.7  # per-position decay for draft positions beyond the catalog's list

__all__ = [
    "CACHE_UNIT_MIN_TOKENS",
    "DecodeRun",
    "EngineCounters",
    "SimEngineCore",
    "SimRequest",
    "StepResult",
    "TokenOutput",
]  # defined in kv_cache.py and step_results.py


# A chunk of a decode run: (clock_s, until_s, most) -> (step ends, tokens per request, cut).
_Chunk = Callable[[float, float, int], tuple[np.ndarray, np.ndarray, bool]]


@dataclass(slots=True, eq=False)
class _Scheduled:
    running: RequestState
    num_new: int
    num_drafts: int
    external_tokens: int = 0


class SimEngineCore:
    """One simulated vLLM engine in virtual time (see the module docstring)."""

    def __init__(
        self,
        config: SimConfig,
        *,
        seed: int = 0,
        noise: float = 0.0,
        mtp_acceptance: Sequence[float] | None = None,
        time_model: StepTimeModel | None = None,
        constants: SpeedConstants | None = None,  # None: the catalog's for the config's GPU
    ) -> None:
        self.config = config
        constants = gpu_constants(config.hardware) if constants is None else constants
        self.constants = constants
        self.memory: MemoryReport = plan_memory(config)
        self.clock_s = 0.0
        self.counters = EngineCounters(
            spec_decode_accepted_per_pos=[0] * config.num_speculative_tokens
        )
        model = get_model(config.model)
        self._time_model = time_model or RooflineTimeModel(
            get_gpu(config.hardware),
            model,
            self.memory,
            enforce_eager=config.enforce_eager,
            constants=constants,
        )
        self._seed = seed
        self._rng = random.Random(seed)  # step-time noise only
        self._noise = noise
        self._kv = KvCacheManager(self.memory, lmcache=config.lmcache)
        self._num_spec = config.num_speculative_tokens
        self._acceptance = self._conditional_acceptance(
            next(
                rates
                for rates in (
                    mtp_acceptance,
                    config.mtp_acceptance,
                    constants.mtp_acceptance,
                    model.default_mtp_acceptance,
                )
                if rates is not None
            )
        )
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []
        self._by_id: dict[str, RequestState] = {}
        self._dead: str | None = None
        # The largest run-time transient any OOM check weighed (bytes): with at least this
        # much headroom, every check passes as here (autotune/sim/virtual/shared_runs.py).
        self.peak_transient_bytes = 0.0
        # The most seats a waiting request asked for (running + 1): with max_num_seqs at
        # least this, every admission's seat check passes as here.
        self.peak_seats = 0

    # ----------------------------------------------------------------- requests
    def check_prompt(self, num_prompt: int) -> None:
        """Raises InputError if a prompt of ``num_prompt`` tokens cannot fit max_model_len."""
        max_model_len = self.memory.max_model_len
        if num_prompt == 0 or num_prompt >= max_model_len:
            raise InputError(
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"prompt contains {num_prompt} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt."
            )

    def add_request(self, request: SimRequest) -> None:
        """Queue a request. Raises InputError if its prompt cannot fit max_model_len."""
        num_prompt = len(request.prompt_token_ids)
        self.check_prompt(num_prompt)
        max_model_len = self.memory.max_model_len
        if request.request_id in self._by_id:
            raise InputError(f"duplicate request id {request.request_id!r}")
        state = RequestState(
            request=request,
            token_ids=np.asarray(request.prompt_token_ids, dtype=np.int64),
            num_prompt=num_prompt,
            max_tokens=max(1, min(request.max_tokens, max_model_len - num_prompt)),
        )
        if self._num_spec:
            state.draw = random.Random(f"{self._seed}:{request.request_id}").random
        self._by_id[request.request_id] = state
        self._waiting.append(state)
        self._update_gauges()

    def abort(self, request_id: str) -> None:
        """Drop a request wherever it is (no output); unknown ids are ignored."""
        state = self._by_id.pop(request_id, None)
        if state is None:
            return
        if state in self._running:
            self._running.remove(state)
        else:
            self._waiting.remove(state)
        self._kv.free(state)
        self._update_gauges()

    @property
    def kv_pool(self) -> KvCacheManager:
        return self._kv

    @property
    def time_model(self) -> StepTimeModel:
        return self._time_model

    def has_unfinished(self) -> bool:
        return bool(self._by_id)

    def advance_to(self, t_s: float) -> None:
        """Idle until ``t_s`` (never moves the clock back)."""
        self.clock_s = max(self.clock_s, t_s)

    def reset_prefix_cache(self) -> int:
        """Drop every unpinned cached block (vLLM's /reset_prefix_cache); returns how many."""
        return self._kv.reset_prefix_cache()

    def _preempt(self, state: RequestState) -> None:
        self._running.remove(state)
        self._kv.free(state)
        state.num_computed = 0
        self._waiting.appendleft(state)
        self.counters.num_preemptions += 1

    # ---------------------------------------------------------------- scheduling
    def _conditional_acceptance(self, rates: Sequence[float]) -> list[float]:
        """Per-position unconditional rates -> P(accept i | accepted i-1)."""
        rates = list(rates)
        while len(rates) < self._num_spec:
            rates.append((rates[-1] if rates else 0.5) * ACCEPTANCE_DECAY)
        conditional: list[float] = []
        previous = 1.0
        for rate in rates[: self._num_spec]:
            conditional.append(min(1.0, rate / previous) if previous > 0 else 0.0)
            previous = rate
        return conditional

    def _record_lookup(self, state: RequestState, local: int, external: int) -> None:
        """Count an admitted request's prefix lookup, as vLLM's metrics do (in tokens)."""
        counters = self.counters
        unit = self._kv.unit_tokens
        if self._kv.caching:
            counters.prefix_cache_queries += state.num_prompt
            counters.prefix_cache_hits += local * unit
        if self._kv.has_host_store:
            counters.external_prefix_cache_queries += state.num_prompt - local * unit
            counters.external_prefix_cache_hits += external * unit
        if state.num_cached is None:
            state.num_cached = (local + external) * unit

    def _schedule(self) -> list[_Scheduled]:
        budget = self.memory.max_num_batched_tokens
        scheduled: list[_Scheduled] = []
        preempted = False
        index = 0
        while index < len(self._running) and budget > 0:
            state = self._running[index]
            remaining = state.num_known - state.num_computed
            drafts = self._num_spec if remaining == 1 and state.num_output > 0 else 0
            num_new = min(remaining + drafts, budget)
            if num_new < remaining + drafts:
                drafts = max(0, num_new - remaining)
            needed_tokens = state.num_computed + num_new
            fits = self._kv.holds(state, needed_tokens)
            lost = False
            while not fits and not self._kv.grow(state, needed_tokens):
                victim = self._running[-1]
                self._preempt(victim)
                preempted = True
                if victim is state:
                    lost = True
                    break
            if lost:
                break
            scheduled.append(_Scheduled(state, num_new, drafts))
            budget -= num_new
            index += 1
        while self._waiting and budget > 0 and not preempted and self._seat_free():
            state = self._waiting[0]
            local, external = self._kv.lookup(state)
            computed = (local + external) * self._kv.unit_tokens
            num_new = min(state.num_known - computed, budget)
            state.num_computed = computed
            if not self._kv.grow(state, computed + num_new):
                self._kv.undo_lookup(state)
                state.num_computed = 0
                break
            self._record_lookup(state, local, external)
            self._waiting.popleft()
            self._running.append(state)
            scheduled.append(_Scheduled(state, num_new, 0, external * self._kv.unit_tokens))
            budget -= num_new
        return scheduled

    def _seat_free(self) -> bool:
        """Whether a waiting request has a seat (fewer than max_num_seqs running)."""
        seats = len(self._running) + 1
        if seats > self.peak_seats:
            self.peak_seats = seats
        return seats <= self.memory.max_num_seqs

    def _accepted_drafts(self, state: RequestState, num_drafts: int) -> int:
        """The leading drafts accepted, by the draws of the positions they would fill."""
        uniforms = self._uniforms(state, num_drafts)
        accepted = 0
        for depth, probability in enumerate(self._acceptance[:num_drafts], start=1):
            if uniforms[state.num_output + depth] >= probability:
                break
            accepted += 1
        return accepted

    @staticmethod
    def _uniforms(state: RequestState, depth: int) -> list[float]:
        """``state``'s draws, at least up to ``depth`` positions past its next output."""
        uniforms, draw = state.uniforms, state.draw
        assert draw is not None
        missing = state.num_output + depth + 1 - len(uniforms)
        if missing > 0:
            uniforms.extend([draw() for _ in range(missing)])
        return uniforms

    # --------------------------------------------------------------------- step
    def step(self) -> StepResult:
        """Run one engine iteration in virtual time and advance the clock by its duration."""
        start_s = self.clock_s
        if self._dead is not None:
            return StepResult(start_s, 0.0, [], oom=self._dead)
        scheduled = self._schedule()
        if not scheduled:
            self._update_gauges()
            return StepResult(start_s, 0.0, [])
        shape = self._shape(scheduled)
        transient = (
            self.memory.transient_prefill_bytes_per_token * shape.num_tokens
            + self.memory.transient_bytes_per_seq * shape.num_seqs
        )
        self.peak_transient_bytes = max(self.peak_transient_bytes, transient)
        if transient > self.memory.headroom_bytes:
            self._dead = torch_oom_text(
                transient, get_gpu(self.config.hardware), self.memory.headroom_bytes
            )
            return StepResult(start_s, 0.0, [], oom=self._dead)
        duration_s = self._noisy(shape)
        outputs = [output for item in scheduled if (output := self._advance(item)) is not None]
        self.clock_s = start_s + duration_s
        self._update_gauges()
        return StepResult(
            start_s,
            duration_s,
            outputs,
            num_prefill_tokens=shape.num_prefill_tokens,
            num_decode_tokens=shape.num_decode_tokens,
        )

    def _shape(self, scheduled: list[_Scheduled]) -> StepShape:
        prefill_tokens = decode_tokens = context = external = spec_seqs = emitting = 0
        prefill_logits = 0  # prefill chunks that complete their prompt sample one token
        pairs = 0.0
        for item in scheduled:
            computed = item.running.num_computed
            emitting += item.num_new - item.num_drafts >= item.running.num_known - computed
            context += computed
            pairs += item.num_new * (computed + item.num_new / 2)
            external += item.external_tokens
            if item.running.num_output > 0 and item.num_new == 1 + item.num_drafts:
                decode_tokens += item.num_new
                spec_seqs += item.num_drafts > 0
            else:
                prefill_tokens += item.num_new
                prefill_logits += item.num_new >= item.running.num_known - computed
        return StepShape(
            num_seqs=len(scheduled),
            num_prefill_tokens=prefill_tokens,
            num_decode_tokens=decode_tokens,
            context_tokens=context,
            attention_pairs=pairs,
            num_spec_seqs=spec_seqs,
            num_draft_passes=self._num_spec if spec_seqs else 0,
            external_load_tokens=external,
            num_output_seqs=emitting,
            num_logit_tokens=decode_tokens + prefill_logits,
        )

    def _advance(self, item: _Scheduled) -> TokenOutput | None:
        state = item.running
        counters = self.counters
        remaining = state.num_known - state.num_computed
        if item.num_new - item.num_drafts < remaining:  # a prefill chunk, no token yet
            state.num_computed += item.num_new
            self._kv.cache_full_blocks(state)
            return None
        accepted = 0
        if item.num_drafts:
            accepted = self._accepted_drafts(state, item.num_drafts)
            counters.spec_decode_num_drafts += 1
            counters.spec_decode_num_draft_tokens += item.num_drafts
            counters.spec_decode_num_accepted_tokens += accepted
            for position in range(accepted):
                counters.spec_decode_accepted_per_pos[position] += 1
        if state.num_output == 0:
            counters.prompt_tokens += state.num_prompt
        new_tokens = min(1 + accepted, state.max_tokens - state.num_output)
        state.num_computed += remaining + min(accepted, new_tokens - 1)
        state.num_output += new_tokens
        counters.generation_tokens += new_tokens
        self._kv.cache_full_blocks(state)
        finished = state.num_output >= state.max_tokens
        if finished:
            self._running.remove(state)
            del self._by_id[state.request.request_id]
            self._kv.free(state)
        return TokenOutput(
            request_id=state.request.request_id,
            new_tokens=new_tokens,
            finished=finished,
            finish_reason="length" if finished else None,
            num_prompt_tokens=state.num_prompt,
            num_cached_tokens=state.num_cached or 0,
        )

    # --------------------------------------------------------------- fast path
    def decode_run(
        self,
        until_s: float,
        *,
        max_steps: int = MAX_RUN_STEPS,
        blocked_until_s: float | None = None,
    ) -> DecodeRun | None:
        """Run the coming steps at once while they are plain decode steps.

        A plain decode step: every running request decodes (1 token plus its
        drafts), none finishes, no request is admitted, no new block needs an
        eviction. Steps start before ``until_s`` (the caller's next event). A
        request waiting for a free seat that the pool has no room for stays
        waiting through such steps: given ``blocked_until_s`` (the caller's next
        reading of the queue), the run goes on while it waits, to that time at
        most. Returns None when the next step is not plain: call ``step()``.
        The predictor's fast path; the result equals as many ``step()`` calls
        (same clock, counters, random draws and prefix-cache order).
        """
        running = self._running
        if self._dead is not None or not running or self.clock_s >= until_s:
            return None
        waiting = bool(self._waiting) and self._seat_free()
        if waiting:
            if blocked_until_s is None or self.clock_s >= blocked_until_s:
                return None
            until_s = min(until_s, blocked_until_s)
        per_seq = 1 + self._num_spec
        num_seqs = len(running)
        memory = self.memory
        transient = (
            memory.transient_prefill_bytes_per_token * num_seqs * per_seq
            + memory.transient_bytes_per_seq * num_seqs
        )
        self.peak_transient_bytes = max(self.peak_transient_bytes, transient)
        if num_seqs * per_seq > memory.max_num_batched_tokens or transient > memory.headroom_bytes:
            return None
        steps = max_steps
        for state in running:
            if state.num_known - state.num_computed != 1 or state.num_output == 0:
                return None
            steps = min(steps, (state.max_tokens - state.num_output - 1) // per_seq)
        if steps < 2:
            return None
        if self._num_spec:
            if waiting and not (self._kv.fits_decode(running, per_seq) and self._admission_fails()):
                return None
            return self._decode_chunks(until_s, steps, self._speculative_chunk, waiting)
        steps = self._kv.steps_without_eviction(running, steps)
        if steps < 2 or (waiting and not self._admission_fails()):
            return None
        return self._decode_chunks(until_s, steps, self._plain_chunk, waiting)

    def _admission_fails(self) -> bool:
        """Whether the next plain decode step's admission of the first waiting request
        fails (no room, even evicting), as it then does in every plain decode step after
        it: they only take blocks. Made and undone as ``_schedule`` makes a failed one
        (its lookup moves the request's cached prefix to the recent end of the cache's
        order), so a run leaves the order step-by-step steps leave. Called only once the
        run's first step is certain."""
        budget = self.memory.max_num_batched_tokens - len(self._running) * (1 + self._num_spec)
        if budget <= 0:
            return True  # the step does not try
        state = self._waiting[0]
        local, external = self._kv.lookup(state)
        computed = (local + external) * self._kv.unit_tokens
        room = self._kv.can_grow(state, computed + min(state.num_known - computed, budget))
        self._kv.undo_lookup(state)
        return not room

    def _decode_chunks(
        self, until_s: float, steps: int, chunk: _Chunk, waiting: bool
    ) -> DecodeRun | None:
        """At most ``steps`` decode steps that start before ``until_s``, a chunk at a time:
        ``chunk(clock_s, until_s, most)`` runs up to ``most`` of them from ``clock_s``;
        ``waiting``: requests wait for room through them."""
        tokens = np.zeros(len(self._running), dtype=np.int64)
        parts: list[np.ndarray] = []
        clock_s, taken = self.clock_s, 0
        while taken < steps and clock_s < until_s:
            ends, chunk_tokens, cut = chunk(clock_s, until_s, steps - taken)
            if len(ends):
                parts.append(ends)
                tokens += chunk_tokens
                taken += len(ends)
                clock_s = float(ends[-1])
            if cut:
                break
        if not parts:
            return None
        return self._finish_run(np.concatenate(parts), tokens.tolist(), waiting)

    def _plain_chunk(
        self, clock_s: float, until_s: float, most: int
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Up to ``most`` decode steps without drafts (their blocks checked to fit by
        ``steps_without_eviction``): their durations at once, then the books."""
        running = self._running
        num_seqs = len(running)
        context = sum(state.num_computed for state in running)
        count = min(most, self._steps_before(clock_s, until_s, num_seqs, 0, context))
        contexts = context + np.arange(count, dtype=np.int64) * num_seqs
        durations = decode_times_s(self._time_model, DecodeSteps(num_seqs, 0, contexts))
        ends = self._step_ends(clock_s, durations, until_s)
        self._kv.decode_tokens(running, len(ends))
        self.counters.generation_tokens += len(ends) * num_seqs
        return ends, np.full(num_seqs, len(ends), dtype=np.int64), len(ends) < count

    def _speculative_chunk(
        self, clock_s: float, until_s: float, most: int
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Up to ``most`` MTP decode steps: each request's accepted drafts first (they do
        not depend on time), then how many steps can grow their blocks without evicting,
        then those steps' durations at once, then the books of the steps that ran."""
        running = self._running
        num_seqs, k = len(running), self._num_spec
        per_seq = 1 + k
        context = sum(state.num_computed for state in running)
        count = min(most, self._steps_before(clock_s, until_s, num_seqs, k, context))
        accepted = [self._accepted_run(state, count) for state in running]
        # Each request's context before each step.
        before = [
            list(itertools.accumulate((1 + a for a in drafts[:-1]), initial=state.num_computed))
            for state, drafts in zip(running, accepted, strict=True)
        ]
        fitting = self._kv.decode_steps_that_fit(running, before, per_seq)
        if fitting == 0:
            return np.zeros(0), np.zeros(num_seqs, dtype=np.int64), True
        steps = zip(*before, strict=True)
        contexts = np.array([sum(step) for step in steps][:fitting], dtype=np.int64)
        durations = decode_times_s(self._time_model, DecodeSteps(num_seqs, k, contexts))
        ends = self._step_ends(clock_s, durations, until_s)
        taken = len(ends)
        done = [taken + sum(drafts[:taken]) for drafts in accepted]
        if taken:
            self._kv.grow_decode(running, [tokens[taken - 1] + per_seq for tokens in before])
            for state, extra in zip(running, done, strict=True):
                state.num_computed += extra
                state.num_output += extra
            counters = self.counters
            depths = Counter(a for drafts in accepted for a in drafts[:taken])
            for position in range(k):
                counters.spec_decode_accepted_per_pos[position] += sum(
                    n for depth, n in depths.items() if depth > position
                )
            emitted = sum(done)
            counters.spec_decode_num_drafts += num_seqs * taken
            counters.spec_decode_num_draft_tokens += num_seqs * k * taken
            counters.spec_decode_num_accepted_tokens += emitted - num_seqs * taken
            counters.generation_tokens += emitted
        return ends, np.array(done, dtype=np.int64), taken < count

    def _accepted_run(self, state: RequestState, steps: int) -> list[int]:
        """The drafts ``state`` gets accepted in each of its next ``steps`` decode steps,
        by the draws of the positions they would fill (as ``_accepted_drafts``)."""
        acceptance = self._acceptance[: self._num_spec]
        uniforms = self._uniforms(state, steps * (1 + self._num_spec) - 1)
        position = state.num_output
        accepted: list[int] = []
        append = accepted.append
        for _ in range(steps):
            first = position + 1  # the draw of the step's first draft
            count = 0
            for probability in acceptance:
                if uniforms[first + count] >= probability:
                    break
                count += 1
            append(count)
            position = first + count
        return accepted

    def _steps_before(
        self, clock_s: float, until_s: float, num_seqs: int, num_drafts: int, context: int
    ) -> int:
        """At least one, and no fewer than the decode steps of this batch that start
        before ``until_s`` when no step is shorter than the first (the roofline's grow
        with the context): how many a chunk computes."""
        if not math.isfinite(until_s):
            return MAX_RUN_STEPS
        first = DecodeSteps(num_seqs, num_drafts, np.array([context], dtype=np.int64))
        first_s = self._time_model.step_time_s(first.shape(0))
        if first_s <= 0:
            return MAX_RUN_STEPS
        return max(1, min(MAX_RUN_STEPS, math.ceil((until_s - clock_s) / first_s) + 1))

    def _step_ends(self, clock_s: float, durations: np.ndarray, until_s: float) -> np.ndarray:
        """The clock at the end of each step (of ``durations``) that starts before
        ``until_s``, as step-by-step ``step()`` calls advance it from ``clock_s``; with
        noise, each step's factor is drawn as its step runs."""
        if self._noise > 0:
            ends = []
            for duration_s in durations.tolist():
                if clock_s >= until_s:
                    break
                clock_s += duration_s * self._noise_factor()
                ends.append(clock_s)
            return np.array(ends, dtype=np.float64)
        # A running sum from the clock, not the clock plus a sum: the same roundings.
        ends = np.cumsum(np.concatenate(([clock_s], durations)))[1:]
        return ends[: min(len(ends), int(np.searchsorted(ends, until_s)) + 1)]

    def _noisy(self, shape: StepShape) -> float:
        duration_s = self._time_model.step_time_s(shape)
        if self._noise > 0:
            duration_s *= self._noise_factor()
        return duration_s

    def _noise_factor(self) -> float:
        return max(MIN_NOISE_FACTOR, 1.0 + self._noise * self._rng.gauss(0.0, 1.0))

    def _finish_run(self, ends: np.ndarray, tokens: list[int], waiting: bool) -> DecodeRun:
        start_s = self.clock_s
        self.clock_s = float(ends[-1])
        self._update_gauges()
        return DecodeRun(
            start_s=start_s,
            step_end_s=ends,
            request_ids=[state.request.request_id for state in self._running],
            tokens=tokens,
            waited=waiting,
        )

    def _update_gauges(self) -> None:
        counters = self.counters
        counters.num_running = len(self._running)
        counters.num_waiting = len(self._waiting)
        counters.kv_cache_usage = self._kv.usage()
