"""A replay in virtual time: the replayer's load policy driving one SimEngineCore.

The load policy (``autotune/replay/load_policy.py``, the one the HTTP replay
follows) decides what is sent when, the budget, the windows and the
saturation verdict; ``VirtualReplay`` is its virtual-time driver: it hands
the policy's sends to the scheduler, steps it to the next send or deadline,
and keeps what each request would have measured at the client, and the
policy's progress reports (``progress``), as the HTTP replay hands them out.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math

import numpy as np

from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.replay.load_policy import LoadPolicy, Progress, Send
from autotune.replay.records import RequestError, RequestRecord
from autotune.replay.stats import ItlHistogram
from autotune.sim.model.prompt import PromptRenderer
from autotune.sim.model.scheduler import DecodeRun, SimEngineCore, SimRequest, StepResult
from autotune.workload.plan import WorkloadPlan

SCRAPE_INTERVAL_S = 5.0  # the replayer's default /metrics interval, in modelled seconds


class _Flight:
    """One request in flight: what the client would have measured so far."""

    __slots__ = (
        "chunks",
        "first_s",
        "gap_runs",
        "gaps",
        "last_s",
        "send",
        "send_s",
        "tokens",
    )

    def __init__(self, send: Send, send_s: float) -> None:
        self.send = send
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
    """The virtual-time driver of the load policy: ``run()``, then read ``records``."""

    def __init__(
        self, engine: SimEngineCore, plan: WorkloadPlan, load: LoadSpec, renderer: PromptRenderer
    ) -> None:
        self.engine = engine
        self.plan = plan
        self.load = load
        self.policy = LoadPolicy(plan, load)
        self.renderer = renderer
        self.records: list[RequestRecord] = []
        self.itl = ItlHistogram()
        self._flights: dict[str, _Flight] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._ids = itertools.count()
        self.peak_running = self.peak_waiting = 0
        self.peak_kv_usage = 0.0
        self.progress: list[Progress] = []  # the window's throughput so far, step by step

    @property
    def stop_reason(self) -> str | None:
        return self.policy.stop_reason

    def window_duration_s(self) -> float | None:
        return self.policy.window_duration_s()

    def _dispatch(self, now_s: float) -> None:
        """Send, in order, whatever the policy has due by ``now_s``, each at its own time."""
        policy = self.policy
        while (at_s := policy.next_send_s()) is not None and at_s <= now_s:
            for send in policy.due(at_s):
                self._send(send, at_s)

    def _send(self, send: Send, now_s: float) -> None:
        planned = send.request
        token_ids = self.renderer.planned_array(planned)
        engine_id = f"{send.record_id}@{next(self._ids)}"
        flight = _Flight(send, now_s)
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
                    cache_salt=send.salt,
                    arrival_s=now_s,
                    prefix_hashes=functools.partial(
                        self.renderer.planned_hashes, planned, salt=send.salt
                    ),
                )
            )
        except InputError as exc:  # the server answers 400 at once
            self._finish(flight, now_s, RequestError.HTTP_4XX, str(exc), len(token_ids))
            return
        self._flights[engine_id] = flight
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
        if error is None:  # the API server's per-request work, after the engine's last step
            end_s += self.engine.constants.request_overhead_s
        in_window = self.policy.completed(end_s, flight.tokens if error is None else 0)
        gaps = flight.all_gaps()
        if in_window:
            self.itl.add_many(gaps)
        ok = error is None
        planned = flight.send.request
        self.records.append(
            RequestRecord(
                id=flight.send.record_id,
                session=planned.session,
                endpoint=planned.endpoint,
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
        self.policy.finished(flight.send, end_s)
        progress = self.policy.progress(end_s)
        if progress is not None:
            self.progress.append(progress)

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

    def _deliver_run(self, run: DecodeRun) -> None:
        ends = run.step_end_s
        later_gaps = ends[1:] - ends[:-1]  # shared by every request of the run (np.diff's)
        first_end_s, last_end_s = float(ends[0]), float(ends[-1])
        for request_id, tokens in zip(run.request_ids, run.tokens, strict=True):
            flight = self._flights.get(request_id)
            if flight is None:
                continue
            flight.gaps.append(first_end_s - flight.last_s)
            if run.waited:  # as step() deliveries were kept: a flight's gaps keep their order
                flight.gaps.extend(later_gaps.tolist())
            else:
                flight.gap_runs.append(later_gaps)
            flight.last_s = last_end_s
            flight.tokens += tokens
            flight.chunks += run.num_steps

    def _next_event_s(self) -> float:
        candidates = [math.inf]
        next_send_s = self.policy.next_send_s()
        if next_send_s is not None:
            candidates.append(next_send_s)
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

    def _sample(self) -> None:
        backlog = len(self._flights)
        reason = self.policy.saturation(self.engine.counters.num_waiting, backlog)
        if reason is not None:
            self.policy.stop(reason)

    def run(self) -> str | None:
        """Run to the end of the plan or budget; returns the OOM text if the engine died."""
        engine = self.engine
        policy = self.policy
        next_scrape_s = SCRAPE_INTERVAL_S
        while policy.stop_reason is None:
            self._dispatch(engine.clock_s)
            if not engine.has_unfinished():
                next_send_s = policy.next_send_s()
                if next_send_s is None:
                    break
                engine.advance_to(next_send_s)
                continue
            run = engine.decode_run(self._next_event_s(), blocked_until_s=next_scrape_s)
            if run is not None:
                self._deliver_run(run)
            else:
                result = engine.step()
                if result.oom is not None:
                    return result.oom
                if result.duration_s == 0 and not result.outputs:
                    next_send_s = policy.next_send_s()
                    if next_send_s is None:
                        break  # nothing can ever run (cannot happen once memory fits)
                    engine.advance_to(next_send_s)
                    continue
                self._deliver(result)
            self._expire(engine.clock_s)
            # A closed loop sends the moment a request ends, and sends due during the step are
            # queued before the readings below, as a scrape at this time would find them.
            self._dispatch(engine.clock_s)
            counters = engine.counters
            self.peak_running = max(self.peak_running, counters.num_running)
            self.peak_waiting = max(self.peak_waiting, counters.num_waiting)
            self.peak_kv_usage = max(self.peak_kv_usage, counters.kv_cache_usage)
            while engine.clock_s >= next_scrape_s:
                self._sample()
                next_scrape_s += SCRAPE_INTERVAL_S
        return None
