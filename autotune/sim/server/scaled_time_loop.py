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

    @property
    def dead(self) -> bool:
        return self.dead_reason is not None

    def virtual_now(self) -> float:
        """The modelled time that corresponds to now."""
        return self._wall() * self.time_scale + self._offset

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
        prefix: str = "req",
    ) -> RequestStream:
        """Queue one request with the engine; its stream receives the tokens.

        ``received_wall_s`` (this runner's wall clock) is when the request
        reached the server: the engine takes it as the arrival, so the time spent
        parsing it, which the time scale would magnify, does not count.
        Without ``ignore_eos`` the model may stop early, at a seeded point in
        ``[min_tokens, max_tokens]`` (finish reason ``stop``). Raises InputError
        for a prompt the engine rejects, EngineDeadError once the engine died.
        """
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        stop_at = None
        if not ignore_eos and self._eos_rng.random() < EARLY_STOP_PROBABILITY:
            stop_at = self._eos_rng.randint(max(1, min_tokens), max_tokens)
            stop_at = None if stop_at >= max_tokens else stop_at
        now_s = self.virtual_now()
        if received_wall_s is not None:
            now_s = min(now_s, received_wall_s * self.time_scale + self._offset)
        if not self.core.has_unfinished():
            self.core.advance_to(max(now_s, self.core.clock_s))
            arrival_s = self.core.clock_s
        else:
            arrival_s = min(now_s, self.core.clock_s)
        request_id = f"{prefix}-{next(self._ids)}"
        self.core.add_request(
            SimRequest(
                request_id=request_id,
                prompt_token_ids=prompt_token_ids,
                max_tokens=max_tokens if stop_at is None else stop_at,
                min_tokens=min_tokens,
                ignore_eos=ignore_eos,
                cache_salt=cache_salt,
                arrival_s=arrival_s,
            )
        )
        stream = RequestStream(
            request_id=request_id,
            prompt_tokens=len(prompt_token_ids),
            max_tokens=max_tokens,
            arrival_s=arrival_s,
            stop_at_tokens=stop_at,
        )
        self._streams[request_id] = stream
        self._wake.set()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """The client went away: stop generating for it."""
        if self._streams.pop(stream.request_id, None) is not None and not stream.finished:
            self.core.abort(stream.request_id)
            self.metrics.observe_finished(self._timing(stream, "abort"))

    async def run(self) -> None:
        """Drive the engine until it dies (or the task is cancelled)."""
        last_yield = self._wall()
        while self.dead_reason is None:
            if not self.core.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
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
            if output.finished:
                stream.finished = True
                stream.finish_reason = output.finish_reason or "length"
                if stream.stop_at_tokens is not None and stream.finish_reason == "length":
                    stream.finish_reason = "stop"
                del self._streams[output.request_id]
                self.metrics.observe_finished(self._timing(stream, stream.finish_reason))
                self.faults.request_finished()
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
