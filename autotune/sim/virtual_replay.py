"""A replay in virtual time: the replayer's load modes driving one SimEngineCore.

``VirtualReplay`` keeps the client's side (what each request measured, the
budget, the measurement window, the saturation stop) and an event heap of
future sends; the load modes (closed loop, sessions, trace) decide when each
request is sent, exactly as autotune/replay/_modes.py does over HTTP.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

import numpy as np

from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.replay.records import RequestError, RequestRecord
from autotune.replay.runner import rising_without_bound
from autotune.replay.stats import ItlHistogram
from autotune.sim.prompt import PromptRenderer
from autotune.sim.scheduler import DecodeRun, SimEngineCore, SimRequest, StepResult
from autotune.workload.plan import PlannedRequest, WorkloadPlan

SCRAPE_INTERVAL_S = 5.0  # the replayer's default /metrics interval, in modelled seconds


class _Flight:
    """One request in flight: what the client would have measured so far."""

    __slots__ = (
        "chunks",
        "first_s",
        "gap_runs",
        "gaps",
        "last_s",
        "planned",
        "record_id",
        "send_s",
        "tokens",
    )

    def __init__(self, planned: PlannedRequest, record_id: str, send_s: float) -> None:
        self.planned = planned
        self.record_id = record_id
        self.send_s = send_s
        self.first_s: float | None = None
        self.last_s = send_s
        self.tokens = 0
        self.chunks = 0
        self.gaps: list[float] = []
        self.gap_runs: list[np.ndarray] = []  # gaps of whole decode runs

    def all_gaps(self) -> np.ndarray:
        return np.concatenate([np.asarray(self.gaps, dtype=np.float64), *self.gap_runs])


class VirtualReplay:
    """Virtual-time replay state; the load modes only decide when to send."""

    def __init__(
        self, engine: SimEngineCore, plan: WorkloadPlan, load: LoadSpec, renderer: PromptRenderer
    ) -> None:
        self.engine = engine
        self.plan = plan
        self.load = load
        self.renderer = renderer
        self.records: list[RequestRecord] = []
        self.itl = ItlHistogram()
        self.sent = 0
        self.completed = 0
        self.closed = False
        self.stop_reason: str | None = None
        self.window_start_s = 0.0
        self.window_end_s: float | None = None
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._flights: dict[str, _Flight] = {}
        self._on_done: dict[str, Callable[[float], None]] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._ids = itertools.count()
        self.peak_running = self.peak_waiting = 0
        self.peak_kv_usage = 0.0

    # ------------------------------------------------------------------ budget
    @property
    def recycling(self) -> bool:
        bounded = self.load.duration_s is not None or self.load.max_requests is not None
        return self.load.recycle_sessions and bounded

    def may_send(self, now_s: float) -> bool:
        if self.load.duration_s is not None and now_s >= self.load.duration_s:
            self.closed = True
        if self.closed:
            return False
        return self.load.max_requests is None or self.sent < self.load.max_requests

    def wait_s(self, plan_gap_s: float) -> float:
        gap_s = plan_gap_s / self.load.timing_scale
        if self.load.max_gap_s is not None:
            gap_s = min(gap_s, self.load.max_gap_s)
        return max(gap_s, 0.0)

    def rounds(self) -> itertools.chain[tuple[str | None, str]]:
        later = ((f"recycle-{k}", f"#{k}") for k in itertools.count(1))
        return itertools.chain([(None, "")], later if self.recycling else [])

    # ------------------------------------------------------------------ events
    def at(self, t_s: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t_s, next(self._order), action))

    def send(
        self,
        planned: PlannedRequest,
        now_s: float,
        *,
        salt: str | None,
        record_id: str,
        on_done: Callable[[float], None],
    ) -> None:
        """Send one request (the caller checked ``may_send``); ``on_done(t)`` when it ends."""
        self.sent += 1
        if self.load.max_requests is not None and self.sent >= self.load.max_requests:
            self.closed = True
        token_ids = self.renderer.render_array(planned.system, planned.messages, planned.endpoint)
        engine_id = f"{record_id}@{next(self._ids)}"
        flight = _Flight(planned, record_id, now_s)
        if planned.exact_output:
            max_tokens, min_tokens = planned.output_tokens, planned.output_tokens
        else:
            max_tokens, min_tokens = planned.output_tokens, 0
        try:
            self.engine.add_request(
                SimRequest(
                    request_id=engine_id,
                    prompt_token_ids=token_ids,
                    max_tokens=max_tokens,
                    min_tokens=min_tokens,
                    ignore_eos=planned.exact_output,
                    cache_salt=salt,
                    arrival_s=now_s,
                )
            )
        except InputError as exc:  # the server answers 400 at once
            self._finish(flight, now_s, RequestError.HTTP_4XX, str(exc), len(token_ids))
            on_done(now_s)
            return
        self._flights[engine_id] = flight
        self._on_done[engine_id] = on_done
        heapq.heappush(self._deadlines, (now_s + self.load.request_timeout_s, engine_id))

    def _finish(
        self,
        flight: _Flight,
        end_s: float,
        error: RequestError | None,
        detail: str | None,
        prompt_tokens: int | None,
        cached_tokens: int | None = None,
    ) -> None:
        self.completed += 1
        in_window = self.completed > self.load.warmup_requests
        gaps = flight.all_gaps()
        if in_window:
            self.itl.add_many(gaps)
            self.window_end_s = end_s
        else:
            self.window_start_s = end_s
        ok = error is None
        self.records.append(
            RequestRecord(
                id=flight.record_id,
                session=flight.planned.session,
                endpoint=flight.planned.endpoint,
                send_s=flight.send_s,
                ttft_s=None if flight.first_s is None else flight.first_s - flight.send_s,
                e2e_s=end_s - flight.send_s if ok else None,
                output_tokens=flight.tokens,
                prompt_tokens=prompt_tokens,
                cached_tokens=cached_tokens,
                chunks=flight.chunks,
                itl_mean_s=float(gaps.mean()) if len(gaps) else None,
                itl_max_s=float(gaps.max()) if len(gaps) else None,
                finish_reason="length" if ok else None,
                error=error,
                http_status=400 if error is RequestError.HTTP_4XX else (None if ok else 200),
                error_detail=detail.splitlines()[0] if detail else None,
                in_window=in_window,
            )
        )

    # -------------------------------------------------------------------- loop
    def _deliver(self, result: StepResult) -> None:
        end_s = result.start_s + result.duration_s
        for output in result.outputs:
            flight = self._flights.get(output.request_id)
            if flight is None:
                continue
            if flight.first_s is None:
                flight.first_s = end_s
            else:
                flight.gaps.append(end_s - flight.last_s)
            flight.last_s = end_s
            flight.tokens += output.new_tokens
            flight.chunks += 1
            if output.finished:
                del self._flights[output.request_id]
                self._finish(
                    flight,
                    end_s,
                    None,
                    None,
                    output.num_prompt_tokens,
                    output.num_cached_tokens,
                )
                self._on_done.pop(output.request_id)(end_s)

    def _deliver_run(self, run: DecodeRun) -> None:
        ends = run.step_end_s
        later_gaps = np.diff(ends)  # shared by every request of the run
        first_end_s, last_end_s = float(ends[0]), float(ends[-1])
        for request_id, tokens in zip(run.request_ids, run.tokens, strict=True):
            flight = self._flights.get(request_id)
            if flight is None:
                continue
            flight.gaps.append(first_end_s - flight.last_s)
            flight.gap_runs.append(later_gaps)
            flight.last_s = last_end_s
            flight.tokens += tokens
            flight.chunks += run.num_steps

    def _next_event_s(self) -> float:
        candidates = [math.inf]
        if self._events:
            candidates.append(self._events[0][0])
        if self._deadlines:
            candidates.append(self._deadlines[0][0])
        return min(candidates)

    def _expire(self, now_s: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now_s:
            _, engine_id = heapq.heappop(self._deadlines)
            flight = self._flights.pop(engine_id, None)
            if flight is None:
                continue
            self.engine.abort(engine_id)
            self._finish(flight, now_s, RequestError.TIMEOUT, "request timed out", None)
            self._on_done.pop(engine_id)(now_s)

    def _sample(self, history: list[int], backlog: list[int]) -> None:
        counters = self.engine.counters
        history.append(counters.num_waiting)
        if self.load.mode == "trace":
            backlog.append(len(self._flights))
        if not self.load.saturation_stop or self.stop_reason is not None:
            return
        if rising_without_bound(history):
            self.stop_reason = (
                f"saturated: server waiting queue rose to {history[-1]} over successive scrapes"
            )
        elif rising_without_bound(backlog):
            self.stop_reason = (
                f"saturated: {backlog[-1]} requests unanswered and rising (open loop)"
            )

    def run(self) -> str | None:
        """Run to the end of the plan or budget; returns the OOM text if the engine died."""
        engine = self.engine
        history: list[int] = []
        backlog: list[int] = []
        next_scrape_s = SCRAPE_INTERVAL_S
        while self.stop_reason is None:
            while self._events and self._events[0][0] <= engine.clock_s:
                heapq.heappop(self._events)[2]()
            if not engine.has_unfinished():
                if not self._events:
                    break
                engine.advance_to(self._events[0][0])
                continue
            run = engine.decode_run(self._next_event_s())
            if run is not None:
                self._deliver_run(run)
            else:
                result = engine.step()
                if result.oom is not None:
                    return result.oom
                if result.duration_s == 0 and not result.outputs:
                    if not self._events:
                        break  # nothing can ever run (cannot happen once memory fits)
                    engine.advance_to(self._events[0][0])
                    continue
                self._deliver(result)
            self._expire(engine.clock_s)
            counters = engine.counters
            self.peak_running = max(self.peak_running, counters.num_running)
            self.peak_waiting = max(self.peak_waiting, counters.num_waiting)
            self.peak_kv_usage = max(self.peak_kv_usage, counters.kv_cache_usage)
            while engine.clock_s >= next_scrape_s:
                self._sample(history, backlog)
                next_scrape_s += SCRAPE_INTERVAL_S
        return None

    def window_duration_s(self) -> float | None:
        if self.window_end_s is None:
            return None
        return max(self.window_end_s - self.window_start_s, 0.0)


# ------------------------------------------------------------------ load modes
def _start_concurrency(replay: VirtualReplay) -> None:
    items = (
        (request, salt, suffix)
        for salt, suffix in replay.rounds()
        for request in replay.plan.requests
    )

    def next_request(now_s: float) -> None:
        if not replay.may_send(now_s):
            return
        item = next(items, None)
        if item is None:
            return
        request, salt, suffix = item
        replay.send(request, now_s, salt=salt, record_id=request.id + suffix, on_done=next_request)

    if replay.plan.requests:
        for _ in range(replay.load.concurrency):
            replay.at(0.0, lambda: next_request(0.0))


def _sessions_in_order(requests: tuple[PlannedRequest, ...]) -> list[list[PlannedRequest]]:
    groups: dict[str, list[PlannedRequest]] = {}
    for request in requests:
        key = request.session if request.session is not None else f"\0{request.id}"
        groups.setdefault(key, []).append(request)
    return list(groups.values())


def _start_sessions(replay: VirtualReplay) -> None:
    sessions = _sessions_in_order(replay.plan.requests)
    items = ((session, salt, suffix) for salt, suffix in replay.rounds() for session in sessions)

    def next_session(now_s: float) -> None:
        if not replay.may_send(now_s):
            return
        item = next(items, None)
        if item is not None:
            _run_session(replay, *item, start_s=now_s, on_done=next_session)

    if sessions:
        for _ in range(replay.load.concurrency):
            replay.at(0.0, lambda: next_session(0.0))


def _run_session(
    replay: VirtualReplay,
    requests: list[PlannedRequest],
    salt: str | None,
    suffix: str,
    *,
    start_s: float,
    on_done: Callable[[float], None],
) -> None:
    """Each request after its in-session dependencies finish plus its gap."""
    ids = {request.id for request in requests}
    pending = {r.id: sum(1 for d in r.after if d in ids) for r in requests}
    dependents: dict[str, list[PlannedRequest]] = {}
    for request in requests:
        for dependency in request.after:
            if dependency in ids:
                dependents.setdefault(dependency, []).append(request)
    remaining = [len(requests)]

    def finished(request: PlannedRequest, t_s: float) -> None:
        for child in dependents.get(request.id, []):
            pending[child.id] -= 1
            if pending[child.id] == 0:
                ready(child, t_s)
        remaining[0] -= 1
        if remaining[0] == 0:
            on_done(t_s)

    def ready(request: PlannedRequest, t_s: float) -> None:
        send_s = t_s + replay.wait_s(request.gap_s)

        def fire() -> None:
            if replay.may_send(send_s):
                replay.send(
                    request,
                    send_s,
                    salt=salt,
                    record_id=request.id + suffix,
                    on_done=lambda end_s: finished(request, end_s),
                )
            else:
                finished(request, send_s)

        replay.at(send_s, fire)

    for request in requests:
        if pending[request.id] == 0:
            ready(request, start_s)


def _start_trace(replay: VirtualReplay) -> None:
    ordered = sorted(replay.plan.requests, key=lambda request: request.arrival_s)
    send_s = 0.0
    previous_s = ordered[0].arrival_s if ordered else 0.0
    for request in ordered:
        send_s += replay.wait_s(request.arrival_s - previous_s)
        previous_s = request.arrival_s

        def fire(request: PlannedRequest = request, at_s: float = send_s) -> None:
            if replay.may_send(at_s):
                replay.send(request, at_s, salt=None, record_id=request.id, on_done=_ignore)

        replay.at(send_s, fire)


def _ignore(_: float) -> None:
    return None


_MODES = {"concurrency": _start_concurrency, "sessions": _start_sessions, "trace": _start_trace}


def start_load(replay: VirtualReplay) -> None:
    """Schedule the first sends of ``replay.load.mode``; later ones follow completions."""
    _MODES[replay.load.mode](replay)
