"""The scaled-time loop: one asyncio task drives the scheduler in scaled wall time.

Each ``SimEngineCore.step()`` models ``duration_s`` seconds; the loop sleeps
``duration_s / time_scale`` of wall time, then hands the step's tokens to the
waiting request streams. Virtual time is tied to wall time by one running
offset (virtual = wall * scale + offset), so sleep jitter never accumulates;
steps that end within a millisecond of now are batched without sleeping.

When the process falls behind (request handlers busy streaming), the loop
catches up by running steps back to back without yielding (they are cheap),
so modelled time keeps pace with the wall clock and the handlers send the
tokens of several steps in one chunk. Only a stall longer than ``MAX_LAG_S``
re-anchors the clock (that time is lost to the model).

In lockstep (``sim/server/lockstep.py``) the replay client holds the clock: the loop steps
only as far as the client allows, admits the client's requests in the client's order,
holds after each of them finishes, and each step's tokens are kept with the step's
modelled end so the answer can be stamped with it. The wall clock then only paces.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.sim.model.scheduler import SimEngineCore, SimRequest, StepResult
from autotune.sim.server.faults import CRASH_ROOT_CAUSE, FaultInjector
from autotune.sim.server.lockstep import ClockedArrival, LockstepClock
from autotune.sim.server.metrics_export import RequestTiming, VllmMetrics

MIN_SLEEP_S = 0.001  # wall; shorter waits are batched
MAX_LAG_S = 1.0  # wall; behind by more than this (a stalled CPU), re-anchor the clock
CATCH_UP_LAG_S = 0.01  # wall; behind by more than this, run steps back to back
MAX_BUSY_S = 0.005  # wall; catching up, still let handlers run this often
EARLY_STOP_PROBABILITY = 0.5  # without ignore_eos, how often the model stops before max_tokens


class EngineDeadError(Exception):
    """The engine core died; every in-flight and later request fails."""


@dataclass(eq=False)
class RequestStream:
    """One request's view of the engine: tokens arrive here, a handler drains them."""

    request_id: str
    prompt_tokens: int
    max_tokens: int  # as requested
    arrival_s: float  # modelled
    stop_at_tokens: int | None = None  # the seeded EOS point, when before max_tokens
    event: asyncio.Event = field(default_factory=asyncio.Event)
    pending_tokens: int = 0  # produced, not yet taken by the handler
    generated_tokens: int = 0
    cached_tokens: int = 0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    clocked: ClockedArrival | None = None  # a lockstep client's request
    deliveries: list[tuple[float, int]] = field(default_factory=list)  # clocked: (step end, n)
    end_s: float | None = None  # modelled: the last step plus the API server's own work
    end_order: int | None = None  # clocked: its place among the ends the lockstep counted

    def take_deliveries(self) -> list[tuple[float, int]]:
        """The steps whose tokens arrived since the last call: (modelled end, tokens)."""
        taken, self.deliveries = self.deliveries, []
        return taken

    async def next_tokens(self) -> int:
        """Wait for new tokens (or the end); returns how many arrived since the last call.

        Returns 0 only once the request has finished and nothing is pending.
        Raises EngineDeadError if the engine died first.
        """
        while True:
            if self.error is not None:
                raise EngineDeadError(self.error)
            if self.pending_tokens or self.finished:
                taken, self.pending_tokens = self.pending_tokens, 0
                return taken
            self.event.clear()
            await self.event.wait()


class EngineRunner:
    """Owns the engine core, the request streams and the virtual clock."""

    def __init__(
        self,
        core: SimEngineCore,
        *,
        time_scale: float,
        metrics: VllmMetrics,
        faults: FaultInjector,
        on_crash: Callable[[str], None],
        seed: int = 0,
        wall_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.core = core
        self.time_scale = time_scale
        self.metrics = metrics
        self.faults = faults
        self._on_crash = on_crash  # called with the root-cause text when the engine dies
        self._wall = wall_clock
        self._offset = core.clock_s - wall_clock() * time_scale
        self._streams: dict[str, RequestStream] = {}
        self._wake = asyncio.Event()
        self._ids = itertools.count()
        self._eos_rng = random.Random(f"eos-{seed}")
        self.dead_reason: str | None = None
        self.lockstep: LockstepClock | None = None
        self._arrivals: list[tuple[RequestStream, _Queued]] = []  # clocked, not yet admitted
        self._by_seq: dict[int, RequestStream] = {}  # clocked streams in flight

    @property
    def dead(self) -> bool:
        return self.dead_reason is not None

    def virtual_now(self) -> float:
        """The modelled time that corresponds to now (in lockstep: the engine's clock)."""
        if self.lockstep is not None:
            return self.core.clock_s
        return self._wall() * self.time_scale + self._offset

    # -- lockstep -------------------------------------------------------------------------

    def start_lockstep(self) -> float:
        """The lockstep client takes the clock; returns its time now (modelled seconds)."""
        if self.lockstep is None:
            self.lockstep = LockstepClock(until_s=self.core.clock_s)
        self._wake.set()
        return self.core.clock_s

    def stop_lockstep(self) -> None:
        """Back to scaled wall time, from the engine's clock as it stands."""
        if self.lockstep is None:
            return
        self.lockstep.hold()
        self.lockstep = None
        self._admit_arrivals()
        self._reanchor()
        self._wake.set()

    async def advance(
        self, until_s: float | None, *, sent: int, cancel: tuple[int, ...] = ()
    ) -> LockstepClock | None:
        """The client's move (see LockstepClock); returns once the engine holds again.

        ``cancel``: the client gave up on these requests (by place in its order): they
        are aborted first. Returns the clock's state, None when not in lockstep.
        """
        lock = self.lockstep
        if lock is None:
            return None
        for seq in cancel:
            stream = self._by_seq.get(seq)
            if stream is not None:
                self.abort(stream)
        if self.dead_reason is None:
            lock.grant(until_s, sent)
            self._wake.set()
            await lock.wait_held()
        return lock

    def arrived_without_engine(self, clocked: ClockedArrival | None, *, ended: bool = True) -> None:
        """A clocked request the engine never sees: answered with an error at once, or
        (``ended`` False) held by a fault that never answers."""
        lock = self.lockstep
        if clocked is not None and lock is not None:
            lock.registered += 1
            lock.ended += int(ended)
            self._wake.set()

    def _admit_arrivals(self) -> None:
        """The clocked requests that arrived, to the engine in the client's order (EOS draws
        and request ids follow it, not the network's)."""
        for stream, queued in sorted(self._arrivals, key=_arrival_order):
            assert queued.clocked is not None
            self._admit(stream, queued, queued.clocked.at_s)
        self._arrivals.clear()

    def _reanchor(self) -> None:
        self._offset = self.core.clock_s - self._wall() * self.time_scale

    def wall_now(self) -> float:
        """This runner's wall clock (seconds, arbitrary origin)."""
        return self._wall()

    def submit(
        self,
        prompt_token_ids: list[int],
        *,
        max_tokens: int,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        cache_salt: str | None = None,
        received_wall_s: float | None = None,
        clocked: ClockedArrival | None = None,
        prefix: str = "req",
    ) -> RequestStream:
        """Queue one request with the engine; its stream receives the tokens.

        ``received_wall_s`` (this runner's wall clock) is when the request
        reached the server: the engine takes it as the arrival, so the time spent
        parsing it, which the time scale would magnify, does not count.
        ``clocked``: a lockstep client's request, sent at its modelled ``at_s``.
        Without ``ignore_eos`` the model may stop early, at a seeded point in
        ``[min_tokens, max_tokens]`` (finish reason ``stop``). Raises InputError
        for a prompt the engine rejects, EngineDeadError once the engine died.
        """
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        queued = _Queued(
            prompt_token_ids, max_tokens, min_tokens, ignore_eos, cache_salt, prefix, clocked
        )
        stream = RequestStream(
            request_id="", prompt_tokens=len(prompt_token_ids), max_tokens=max_tokens,
            arrival_s=0.0, clocked=clocked,
        )  # fmt: skip
        lock = self.lockstep
        if clocked is not None and lock is not None:  # admitted once all it sent arrived
            self.core.check_prompt(len(prompt_token_ids))
            self._arrivals.append((stream, queued))
            lock.registered += 1
        else:
            now_s = self.virtual_now()
            if received_wall_s is not None:
                now_s = min(now_s, received_wall_s * self.time_scale + self._offset)
            self._admit(stream, queued, now_s)
        self._wake.set()
        return stream

    def _admit(self, stream: RequestStream, queued: _Queued, now_s: float) -> None:
        """Hand one request to the engine, arriving at modelled ``now_s``."""
        stop_at = None
        if not queued.ignore_eos and self._eos_rng.random() < EARLY_STOP_PROBABILITY:
            stop_at = self._eos_rng.randint(max(1, queued.min_tokens), queued.max_tokens)
            stop_at = None if stop_at >= queued.max_tokens else stop_at
        if not self.core.has_unfinished():
            self.core.advance_to(max(now_s, self.core.clock_s))
            arrival_s = self.core.clock_s
        else:
            arrival_s = min(now_s, self.core.clock_s)
        request_id = f"{queued.prefix}-{next(self._ids)}"
        self.core.add_request(
            SimRequest(
                request_id=request_id,
                prompt_token_ids=queued.prompt_token_ids,
                max_tokens=queued.max_tokens if stop_at is None else stop_at,
                min_tokens=queued.min_tokens,
                ignore_eos=queued.ignore_eos,
                cache_salt=queued.cache_salt,
                arrival_s=arrival_s,
            )
        )
        stream.request_id = request_id
        stream.arrival_s = arrival_s
        stream.stop_at_tokens = stop_at
        self._streams[request_id] = stream
        if queued.clocked is not None:
            self._by_seq[queued.clocked.seq] = stream

    def abort(self, stream: RequestStream) -> None:
        """The client went away: stop generating for it."""
        queued = [entry for entry in self._arrivals if entry[0] is stream]
        if queued:
            self._arrivals.remove(queued[0])
            self._ended(stream)
            return
        if stream.request_id and self._streams.get(stream.request_id) is stream:
            del self._streams[stream.request_id]
            if not stream.finished:
                self.core.abort(stream.request_id)
                self.metrics.observe_finished(self._timing(stream, "abort"))
                self._ended(stream)

    def _ended(self, stream: RequestStream) -> None:
        if stream.clocked is not None:
            self._by_seq.pop(stream.clocked.seq, None)
            if self.lockstep is not None:
                self.lockstep.ended += 1
                stream.end_order = self.lockstep.ended

    async def _idle(self) -> None:
        self._wake.clear()
        await self._wake.wait()

    async def _lockstep_turn(self, lock: LockstepClock) -> bool:
        """One pass of the loop in lockstep; True when the engine may step now."""
        if not lock.all_arrived:
            await self._idle()
            return False
        self._admit_arrivals()
        busy = self.core.has_unfinished()
        if lock.must_hold(self.core.clock_s, busy):
            lock.hold()
            await self._idle()  # the wall time it holds is caught up later, as a lag
            return False
        if busy:
            return True
        assert lock.until_s is not None  # must_hold holds an idle engine without a bound
        delay = (lock.until_s - self._offset) / self.time_scale - self._wall()
        if delay > MIN_SLEEP_S:
            await asyncio.sleep(delay)
        self.core.advance_to(lock.until_s)
        return False

    async def run(self) -> None:
        """Drive the engine until it dies (or the task is cancelled)."""
        last_yield = self._wall()
        while self.dead_reason is None:
            lock = self.lockstep
            if lock is not None:
                if not await self._lockstep_turn(lock):
                    continue
            elif not self.core.has_unfinished():
                await self._idle()
                continue
            result = self.core.step()
            self.metrics.observe_iteration(result.num_prefill_tokens + result.num_decode_tokens)
            end_s = result.start_s + result.duration_s
            delay = (end_s - self._offset) / self.time_scale - self._wall()
            if delay > MIN_SLEEP_S:
                await asyncio.sleep(delay)
                last_yield = self._wall()
            else:
                if delay < -MAX_LAG_S:
                    self._offset = end_s - self._wall() * self.time_scale
                # A little late (sleep jitter): hand this step's tokens out now. Far behind:
                # catch up first, letting the handlers in only every MAX_BUSY_S.
                if delay > -CATCH_UP_LAG_S or self._wall() - last_yield > MAX_BUSY_S:
                    await asyncio.sleep(0)
                    last_yield = self._wall()
            if result.oom is not None:
                self.die(result.oom)
                return
            self._deliver(result, end_s)
            if self.faults.crash_due:
                self.die(CRASH_ROOT_CAUSE)
                return

    def die(self, root_cause: str) -> None:
        """The engine core failed: fail every stream, refuse new requests."""
        if self.dead_reason is not None:
            return
        self.dead_reason = root_cause
        for stream in self._streams.values():
            stream.error = root_cause
            stream.event.set()
        self._streams.clear()
        if self.lockstep is not None:
            self.lockstep.hold()
        self._on_crash(root_cause)

    def _deliver(self, result: StepResult, end_s: float) -> None:
        for output in result.outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue  # aborted meanwhile
            if stream.scheduled_s is None:
                stream.scheduled_s = result.start_s
            stream.cached_tokens = output.num_cached_tokens
            if output.new_tokens > 0:
                if stream.last_token_s is None:
                    stream.first_token_s = end_s
                else:
                    self.metrics.observe_itl(end_s - stream.last_token_s)
                stream.last_token_s = end_s
                stream.generated_tokens += output.new_tokens
                stream.pending_tokens += output.new_tokens
                if stream.clocked is not None:
                    stream.deliveries.append((end_s, output.new_tokens))
            if output.finished:
                stream.finished = True
                stream.end_s = end_s + self.core.constants.request_overhead_s
                stream.finish_reason = output.finish_reason or "length"
                if stream.stop_at_tokens is not None and stream.finish_reason == "length":
                    stream.finish_reason = "stop"
                del self._streams[output.request_id]
                self.metrics.observe_finished(self._timing(stream, stream.finish_reason))
                self.faults.request_finished()
                if stream.clocked is not None and self.lockstep is not None:
                    self.lockstep.completion_pending = True  # the client may answer it at once
                self._ended(stream)
            stream.event.set()

    def _timing(self, stream: RequestStream, reason: str) -> RequestTiming:
        now_s = stream.last_token_s if stream.last_token_s is not None else self.core.clock_s
        scheduled_s = stream.scheduled_s if stream.scheduled_s is not None else now_s
        return RequestTiming(
            arrival_s=stream.arrival_s,
            scheduled_s=scheduled_s,
            first_token_s=stream.first_token_s if stream.first_token_s is not None else now_s,
            finished_s=now_s,
            prompt_tokens=stream.prompt_tokens,
            cached_tokens=stream.cached_tokens,
            generation_tokens=stream.generated_tokens,
            max_tokens=stream.max_tokens,
            finish_reason=reason,
        )


@dataclass(frozen=True)
class _Queued:
    """A request as it was submitted, until the engine admits it."""

    prompt_token_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    cache_salt: str | None
    prefix: str
    clocked: ClockedArrival | None


def _arrival_order(entry: tuple[RequestStream, _Queued]) -> tuple[float, int]:
    clocked = entry[1].clocked
    assert clocked is not None
    return clocked.at_s, clocked.seq
