"""One replay's shared state: clock, budget, window, in-flight requests, records."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx

from autotune.replay.client import RequestOutcome, send_request
from autotune.replay.load import LoadSpec, ReplayObserver
from autotune.replay.records import RequestError, RequestRecord
from autotune.replay.stats import ItlHistogram
from autotune.workload.plan import PlannedRequest, WorkloadPlan

UNREACHABLE_STREAK = 20  # this many connection failures in a row: the server is gone


class Run:
    """The state every load mode shares; the modes only decide *when* to send."""

    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        plan: WorkloadPlan,
        load: LoadSpec,
        model_name: str,
        time_scale: float,
        api_key: str | None,
        observer: ReplayObserver | None,
    ) -> None:
        self.client = client
        self.plan = plan
        self.load = load
        self.model_name = model_name
        self.time_scale = time_scale
        self._api_key = api_key
        self._observer = observer
        self.records: list[RequestRecord] = []
        self.itl = ItlHistogram()
        self.in_flight = 0
        self.sent = 0
        self.stop_reason: str | None = None
        self._completed = 0
        self._connect_streak = 0
        self._tasks: set[asyncio.Task[object]] = set()
        self._closed = asyncio.Event()
        self.origin = time.perf_counter()
        self._window_start = self.origin
        self._window_end: float | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_wall: float | None = None
        if load.duration_s is not None:
            self._deadline_wall = self.origin + load.duration_s / time_scale
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(load.duration_s / time_scale, self.close)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def recycling(self) -> bool:
        """Whether the plan is replayed again (fresh salts) until the budget runs out."""
        bounded = self.load.duration_s is not None or self.load.max_requests is not None
        return self.load.recycle_sessions and bounded

    @property
    def expected_total(self) -> int | None:
        if self.recycling:
            return self.load.max_requests
        planned = len(self.plan.requests)
        return min(planned, self.load.max_requests) if self.load.max_requests else planned

    def close(self) -> None:
        """No more sends; requests in flight finish."""
        self._closed.set()
        if self._deadline is not None:
            self._deadline.cancel()

    def stop(self, reason: str) -> None:
        """Stop early: no more sends, requests in flight abandoned."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.close()
        for task in self._tasks:
            task.cancel()

    def plan_wait_s(self, plan_gap_s: float) -> float:
        """Wall seconds to wait for a recorded gap (timing scale, cap, server speed-up)."""
        gap_s = plan_gap_s / self.load.timing_scale
        if self.load.max_gap_s is not None:
            gap_s = min(gap_s, self.load.max_gap_s)
        return max(gap_s, 0.0) / self.time_scale

    async def wait(self, wall_s: float) -> bool:
        """Sleep ``wall_s``, waking early if the run closes. True while still open."""
        if wall_s > 0 and not self.closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), wall_s)
        return not self.closed

    def may_send(self) -> bool:
        # The timer closes the run, but a busy loop may fire it late: check the clock too.
        if self._deadline_wall is not None and time.perf_counter() >= self._deadline_wall:
            self.close()
        if self.closed:
            return False
        return self.load.max_requests is None or self.sent < self.load.max_requests

    def claim(self) -> None:
        """Count one request against the budget now (closing the run when it is spent)."""
        self.sent += 1
        if self.load.max_requests is not None and self.sent >= self.load.max_requests:
            self.close()

    async def send(
        self,
        request: PlannedRequest,
        *,
        salt: str | None = None,
        record_id: str | None = None,
        claimed: bool = False,
    ) -> RequestRecord | None:
        """Send one request (the caller checked ``may_send``); None if abandoned.

        ``claimed``: the caller already counted it with ``claim`` (needed when the
        send runs as a task, so the next ``may_send`` sees it at once).
        """
        if not claimed:
            self.claim()
        self.in_flight += 1
        task = asyncio.create_task(
            self._send_in_time(
                self.client,
                request,
                model_name=self.model_name,
                origin_s=self.origin,
                time_scale=self.time_scale,
                timeout_s=self.load.request_timeout_s,
                api_key=self._api_key,
                salt=salt,
                record_id=record_id,
            )
        )
        self._tasks.add(task)
        try:
            outcome = await task
            if outcome is None:
                return None  # the duration ran out before the task got to send
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are cancelled ourselves, not only the request
            return None
        finally:
            self._tasks.discard(task)
            self.in_flight -= 1
        self._completed += 1
        record = outcome.record
        if self._completed <= self.load.warmup_requests:
            record = record.model_copy(update={"in_window": False})
            self._window_start = outcome.end_wall_s
        else:
            self.itl.add_many(outcome.gaps_s)
            self._window_end = outcome.end_wall_s
        self.records.append(record)
        if self._observer is not None:
            self._observer.on_request_done(record, self._completed, self.expected_total)
        self._watch_connection(record)
        return record

    async def _send_in_time(self, *args: Any, **kwargs: Any) -> RequestOutcome | None:
        """``send_request``, unless the duration ran out while the task waited to run."""
        if self._deadline_wall is not None and time.perf_counter() >= self._deadline_wall:
            return None
        return await send_request(*args, **kwargs)

    def _watch_connection(self, record: RequestRecord) -> None:
        if record.error is RequestError.CONNECT:
            self._connect_streak += 1
            if self._connect_streak >= UNREACHABLE_STREAK:
                self.stop(
                    f"server unreachable: {self._connect_streak} connection failures in a row"
                )
        else:
            self._connect_streak = 0

    def window_duration_s(self) -> float | None:
        """The measurement window in modelled seconds (None: nothing completed in it)."""
        if self._window_end is None:
            return None
        return max(self._window_end - self._window_start, 0.0) * self.time_scale
