"""The load policy: which request is sent next and when, in modelled time.

One policy serves both replays: the asyncio HTTP driver (``http_driver.py``)
and the virtual-time driver (``autotune/sim/virtual/replay.py``). It decides;
the drivers own the clocks, the sockets and the scheduler. It is clock-free:
every call says the modelled time (seconds since the replay began) it is made
at. A driver's loop:

- ``next_send_s()``: when the next send is due (None: nothing pending, and
  once the run is closed nothing ever is);
- ``due(now_s)``: the sends to make now, each counted against the budget;
- ``finished(send, end_s)``: a sent request ended, or was abandoned: its slot
  takes the next request or session, its dependents get their gap;
- ``completed(end_s, output_tokens)``: a request produced a record; whether it
  counts in the measurement window;
- ``progress(now_s)``: after a completion, a ``Progress`` when the run crossed
  another ``PROGRESS_STEP_PCT`` of its budget: the window's output throughput so
  far, computed as the final figure is (for pruning hopeless trials);
- ``saturation(waiting, in_flight)``: one reading of the queues; the stop
  reason once they grow without bound.

Modes (see ``LoadSpec``): ``concurrency`` and ``sessions`` run ``concurrency``
slots, each taking the next request (or session) when its last one ends;
``trace`` schedules every request at its scaled arrival up front, or, with
``max_in_flight``, that many at first and each later one when a request ends (at its
arrival or then, whichever is later: a semaphore in front of an open loop). With
``recycle_sessions`` and a budget, the plan starts again with a fresh cache
salt each round. Warm-up: the first ``warmup_requests`` completions are out
of the window, which runs from the last of them (or the start) to the last
completion.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from autotune.replay.load import LoadSpec
from autotune.workload.plan import PlannedRequest, WorkloadPlan

SATURATION_SCRAPES = 4  # successive rises of the waiting queue that mean "without bound"
SATURATION_MIN_QUEUE = 8  # a queue this short is never called saturated
PROGRESS_STEP_PCT = 5  # a progress report each time the run crosses this much of its budget

T = TypeVar("T")


def rising_without_bound(history: list[int]) -> bool:
    """True when the last SATURATION_SCRAPES steps all rose and the queue is long."""
    recent = history[-(SATURATION_SCRAPES + 1) :]
    if len(recent) <= SATURATION_SCRAPES or recent[-1] < SATURATION_MIN_QUEUE:
        return False
    return all(later > earlier for earlier, later in itertools.pairwise(recent))


def sessions_in_order(requests: Sequence[PlannedRequest]) -> list[list[PlannedRequest]]:
    """Requests grouped by session, sessions in order of first request; a request
    without a session is a session of its own."""
    groups: dict[str, list[PlannedRequest]] = {}
    for request in requests:
        key = request.session if request.session is not None else f"\0{request.id}"
        groups.setdefault(key, []).append(request)
    return list(groups.values())


@dataclass(eq=False)
class _SessionRun:
    """One session being replayed: which of its requests still wait on others."""

    salt: str | None
    suffix: str
    waiting_on: dict[str, int]
    dependents: dict[str, list[PlannedRequest]]
    remaining: int


@dataclass(frozen=True)
class Progress:
    """The measurement window so far: ``step`` = percent of the run's budget done,
    ``output_tok_s`` = in-window output tokens of requests that succeeded over the window
    up to the last completion (the final figure's formula), ``at_s`` = modelled time."""

    step: int
    output_tok_s: float
    at_s: float


@dataclass(frozen=True, eq=False)
class Send:
    """One request to send at modelled time ``at_s``, with its cache salt and record id."""

    request: PlannedRequest
    at_s: float
    salt: str | None
    record_id: str
    session: _SessionRun | None = field(default=None, repr=False)


class LoadPolicy:
    """The decisions of one replay under ``load``; see the module docstring."""

    def __init__(self, plan: WorkloadPlan, load: LoadSpec) -> None:
        self.plan = plan
        self.load = load
        self.sent = 0
        self.completions = 0
        self.closed = False
        self.stop_reason: str | None = None
        self._pending: list[tuple[float, int, Send]] = []
        self._order = itertools.count()
        self._window_start_s = 0.0
        self._window_end_s: float | None = None
        self._window_tokens = 0
        self._reported_step = 0
        self._waiting: list[int] = []
        self._backlog: list[int] = []
        self._arrivals: Iterator[tuple[float, PlannedRequest]] = iter(())
        if load.mode == "trace":
            self._schedule_trace()
            return
        units: Sequence[PlannedRequest | list[PlannedRequest]] = (
            plan.requests if load.mode == "concurrency" else sessions_in_order(plan.requests)
        )
        self._units = self._while_open(units)
        if units:
            for _ in range(load.concurrency):
                self._next_unit(0.0)

    # ---------------------------------------------------------------- budget
    @property
    def recycling(self) -> bool:
        """Whether the plan is replayed again (fresh salts) until the budget runs out."""
        bounded = self.load.duration_s is not None or self.load.max_requests is not None
        return self.load.recycle_sessions and bounded

    @property
    def expected_total(self) -> int | None:
        """How many requests the run will send, when known."""
        if self.recycling:
            return self.load.max_requests
        planned = len(self.plan.requests)
        return min(planned, self.load.max_requests) if self.load.max_requests else planned

    def may_send(self, now_s: float) -> bool:
        """Whether a request may still be sent at ``now_s`` (closing the run past its duration)."""
        if self.load.duration_s is not None and now_s >= self.load.duration_s:
            self.close()
        if self.closed:
            return False
        return self.load.max_requests is None or self.sent < self.load.max_requests

    def close(self) -> None:
        """No more sends (what was pending is dropped); requests in flight finish."""
        self.closed = True
        self._pending.clear()

    def stop(self, reason: str) -> None:
        """Stop early for ``reason`` (the first reason is kept); no more sends."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.close()

    def wait_s(self, plan_gap_s: float) -> float:
        """Modelled seconds to wait for a recorded gap (timing scale, then the cap)."""
        gap_s = plan_gap_s / self.load.timing_scale
        if self.load.max_gap_s is not None:
            gap_s = min(gap_s, self.load.max_gap_s)
        return max(gap_s, 0.0)

    # ----------------------------------------------------------------- sends
    def next_send_s(self) -> float | None:
        """Modelled time of the next pending send (None: nothing pending)."""
        return self._pending[0][0] if self._pending else None

    def due(self, now_s: float) -> list[Send]:
        """The pending sends due by ``now_s``, each counted against the budget (which may
        close the run: then nothing more is pending)."""
        sends: list[Send] = []
        while self._pending and self._pending[0][0] <= now_s and self.may_send(now_s):
            sends.append(heapq.heappop(self._pending)[2])
            self.sent += 1
            if self.load.max_requests is not None and self.sent >= self.load.max_requests:
                self.close()
        return sends

    def finished(self, send: Send, end_s: float) -> None:
        """``send``'s request ended at ``end_s`` (done, failed, abandoned or skipped)."""
        if self.load.mode == "concurrency":
            self._next_unit(end_s)
        elif self.load.mode == "trace":
            self._next_arrival(end_s)
        elif send.session is not None:
            run = send.session
            for child in run.dependents.get(send.request.id, ()):
                run.waiting_on[child.id] -= 1
                if run.waiting_on[child.id] == 0:
                    self._ready(child, run, end_s)
            run.remaining -= 1
            if run.remaining == 0:
                self._next_unit(end_s)

    def _push(self, send: Send) -> None:
        if not self.closed:
            heapq.heappush(self._pending, (send.at_s, next(self._order), send))

    def _rounds(self) -> Iterator[tuple[str | None, str]]:
        """Round 0 as planned; later rounds (recycling) with a fresh salt each."""
        yield None, ""
        if self.recycling:
            for k in itertools.count(1):
                yield f"recycle-{k}", f"#{k}"

    def _while_open(self, units: Sequence[T]) -> Iterator[tuple[T, str | None, str]]:
        for salt, suffix in self._rounds():
            for unit in units:
                if self.closed:
                    return
                yield unit, salt, suffix

    def _next_unit(self, now_s: float) -> None:
        """A free slot takes the next request (concurrency) or session (sessions)."""
        if not self.may_send(now_s):
            return
        item = next(self._units, None)
        if item is None:
            return
        unit, salt, suffix = item
        if isinstance(unit, PlannedRequest):
            self._push(Send(unit, now_s, salt, unit.id + suffix))
        else:
            self._start_session(unit, salt, suffix, now_s)

    def _start_session(
        self, requests: list[PlannedRequest], salt: str | None, suffix: str, now_s: float
    ) -> None:
        """Each request goes after its in-session dependencies end plus its gap;
        threads (subagents) run side by side."""
        ids = {request.id for request in requests}
        run = _SessionRun(
            salt=salt,
            suffix=suffix,
            waiting_on={r.id: sum(1 for d in r.after if d in ids) for r in requests},
            dependents={},
            remaining=len(requests),
        )
        for request in requests:
            for dependency in request.after:
                if dependency in ids:
                    run.dependents.setdefault(dependency, []).append(request)
        for request in requests:
            if run.waiting_on[request.id] == 0:
                self._ready(request, run, now_s)

    def _ready(self, request: PlannedRequest, run: _SessionRun, now_s: float) -> None:
        at_s = now_s + self.wait_s(request.gap_s)
        self._push(Send(request, at_s, run.salt, request.id + run.suffix, run))

    def _schedule_trace(self) -> None:
        """Open loop: each request at its recorded arrival, scaled, gaps capped; with
        ``max_in_flight``, only the first that many now (the rest as requests end)."""
        ordered = sorted(self.plan.requests, key=lambda request: request.arrival_s)
        arrivals: list[tuple[float, PlannedRequest]] = []
        at_s = 0.0
        previous_s = ordered[0].arrival_s if ordered else 0.0
        for request in ordered:
            at_s += self.wait_s(request.arrival_s - previous_s)
            previous_s = request.arrival_s
            arrivals.append((at_s, request))
        self._arrivals = iter(arrivals)
        for _ in range(self.load.max_in_flight or len(arrivals)):
            self._next_arrival(0.0)

    def _next_arrival(self, now_s: float) -> None:
        """A free slot (trace): the next arrival goes at its time, or now if it is past."""
        item = next(self._arrivals, None)
        if item is not None:
            at_s, request = item
            self._push(Send(request, max(at_s, now_s), None, request.id))

    # --------------------------------------------------------- measurement
    def completed(self, end_s: float, output_tokens: int = 0) -> bool:
        """A request produced a record at ``end_s`` with ``output_tokens`` counted (0 for a
        failed one); True if it counts in the window."""
        self.completions += 1
        if self.completions <= self.load.warmup_requests:
            self._window_start_s = end_s
            return False
        self._window_end_s = end_s
        self._window_tokens += output_tokens
        return True

    def done_pct(self, now_s: float) -> float:
        """How much of the run's budget is spent at ``now_s``, in percent: window
        completions of those expected, or modelled time of ``duration_s``, the larger."""
        done = 0.0
        expected = self.expected_total
        if expected is not None and expected > self.load.warmup_requests:
            in_window = max(self.completions - self.load.warmup_requests, 0)
            done = in_window / (expected - self.load.warmup_requests)
        if self.load.duration_s is not None:
            done = max(done, now_s / self.load.duration_s)
        return 100.0 * min(done, 1.0)

    def progress(self, now_s: float) -> Progress | None:
        """The window's throughput so far, once per ``PROGRESS_STEP_PCT`` of the budget
        crossed (the last step below 100: the final figure is the trial's value)."""
        if self._window_end_s is None:
            return None
        step = int(self.done_pct(now_s) // PROGRESS_STEP_PCT) * PROGRESS_STEP_PCT
        if step <= self._reported_step or step >= 100:
            return None
        self._reported_step = step
        duration_s = self._window_end_s - self._window_start_s
        tok_s = self._window_tokens / duration_s if duration_s > 0 else 0.0
        return Progress(step=step, output_tok_s=tok_s, at_s=now_s)

    def window_duration_s(self) -> float | None:
        """The measurement window in modelled seconds (None: nothing completed in it)."""
        if self._window_end_s is None:
            return None
        return max(self._window_end_s - self._window_start_s, 0.0)

    def saturation(self, waiting: int | None, in_flight: int) -> str | None:
        """One reading of the server's waiting queue (None: not read) and of the requests
        in flight; the stop reason when either grows without bound (once, and only
        if ``load.saturation_stop``). The open-loop backlog counts in trace mode only."""
        if waiting is not None:
            self._waiting.append(waiting)
        if self.load.mode == "trace":
            self._backlog.append(in_flight)
        if not self.load.saturation_stop or self.stop_reason is not None:
            return None
        if rising_without_bound(self._waiting):
            return (
                f"saturated: server waiting queue rose to {self._waiting[-1]} "
                "over successive scrapes"
            )
        if rising_without_bound(self._backlog):
            return f"saturated: {self._backlog[-1]} requests unanswered and rising (open loop)"
        return None
