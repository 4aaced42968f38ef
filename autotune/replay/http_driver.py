"""The HTTP driver: sends what the load policy says, when it says, over real connections.

The policy (``load_policy.py``) decides in modelled seconds; this driver keeps
the wall clock (modelled = wall since start x the server's time scale), one
asyncio task per request in flight, the records, and the one verdict only a
network can give: the server stopped accepting connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx

from autotune.replay.client import RequestOutcome, send_request
from autotune.replay.load import LoadSpec, ReplayObserver
from autotune.replay.load_policy import LoadPolicy, Progress, Send
from autotune.replay.records import RequestError, RequestRecord
from autotune.replay.stats import ItlHistogram
from autotune.workload.plan import WorkloadPlan

UNREACHABLE_STREAK = 20  # this many connection failures in a row: the server is gone


class HttpDriver:
    """One replay over HTTP: ``await driver.run()``, then read ``records`` and ``itl``."""

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
        on_progress: Callable[[Progress], bool] | None = None,
    ) -> None:
        self.client = client
        self.load = load
        self.policy = LoadPolicy(plan, load)
        self.model_name = model_name
        self.time_scale = time_scale
        self._api_key = api_key
        self._observer = observer
        self._on_progress = on_progress
        self.records: list[RequestRecord] = []
        self.itl = ItlHistogram()
        self.in_flight = 0
        self._connect_streak = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self.origin = time.perf_counter()  # the replay's start on the driver's clock
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_wall: float | None = None

    def now_s(self, wall_s: float | None = None) -> float:
        """Modelled seconds since the start, at ``wall_s`` (perf_counter; default now)."""
        wall_s = time.perf_counter() if wall_s is None else wall_s
        return (wall_s - self.origin) * self.time_scale

    def _close(self) -> None:
        self.policy.close()
        self._wake.set()

    def stop(self, reason: str) -> None:
        """Stop early: no more sends, requests in flight abandoned (not recorded)."""
        self.policy.stop(reason)
        for task in self._tasks:
            task.cancel()
        self._wake.set()

    def _past_deadline(self) -> bool:
        # The timer closes the run, but a busy loop may fire it late: check the clock too.
        return self._deadline_wall is not None and time.perf_counter() >= self._deadline_wall

    async def run(self) -> None:
        """Send until the plan or the budget is spent and every request has ended."""
        policy = self.policy
        self.origin = time.perf_counter()
        if self.load.duration_s is not None:
            self._deadline_wall = self.origin + self.load.duration_s / self.time_scale
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(self.load.duration_s / self.time_scale, self._close)
        try:
            while policy.stop_reason is None:
                if self._past_deadline():
                    policy.close()
                for send in policy.due(self.now_s()):
                    self._start(send)
                next_s = policy.next_send_s()
                if next_s is None and self.in_flight == 0:
                    return
                self._wake.clear()
                timeout_s = None if next_s is None else (next_s - self.now_s()) / self.time_scale
                if timeout_s is None or timeout_s > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout_s)
        finally:  # stopped, or cancelled from outside: no request outlives the replay
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._deadline is not None:
                self._deadline.cancel()

    def _start(self, send: Send) -> asyncio.Task[None]:
        self.in_flight += 1
        task = asyncio.create_task(self._send(send))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _request(self, send: Send, **clock: float | int) -> RequestOutcome:
        """``send``'s request over HTTP (``clock``: lockstep's send time and place)."""
        return await send_request(
            self.client,
            send.request,
            model_name=self.model_name,
            origin_s=self.origin,
            time_scale=self.time_scale,
            timeout_s=self.load.request_timeout_s,
            api_key=self._api_key,
            salt=send.salt,
            record_id=send.record_id,
            **clock,  # type: ignore[arg-type]
        )

    async def _send(self, send: Send) -> None:
        outcome: RequestOutcome | None = None
        try:
            if not self._past_deadline():  # the duration may run out before the task runs
                outcome = await self._request(send)
        finally:
            self.in_flight -= 1
            self._wake.set()
        if outcome is None:
            self.policy.finished(send, self.now_s())
            return
        self._record(send, outcome)

    def _record(self, send: Send, outcome: RequestOutcome) -> None:
        """A request ended: its record, the window, the policy's next move, progress."""
        end_s = self.now_s(outcome.end_clock_s)
        record = outcome.record
        if self.policy.completed(end_s, record.output_tokens if record.ok else 0):
            self.itl.add_many(outcome.gaps_s)
        else:
            record = record.model_copy(update={"in_window": False})
        self.records.append(record)
        if self._observer is not None:
            self._observer.on_request_done(
                record, self.policy.completions, self.policy.expected_total
            )
        self._watch_connection(record)
        self.policy.finished(send, end_s)
        self._report_progress(end_s)

    def _report_progress(self, end_s: float) -> None:
        """Hand the window's throughput so far to ``on_progress``; True back stops the run."""
        if self._on_progress is None or self.policy.stop_reason is not None:
            return
        progress = self.policy.progress(end_s)
        if progress is not None and self._on_progress(progress):
            self.stop(
                f"pruned at {progress.step}% of the replay: "
                f"{progress.output_tok_s:.1f} output tok/s so far"
            )

    def _watch_connection(self, record: RequestRecord) -> None:
        if record.error is RequestError.CONNECT:
            self._connect_streak += 1
            if self._connect_streak >= UNREACHABLE_STREAK:
                self.stop(
                    f"server unreachable: {self._connect_streak} connection failures in a row"
                )
        else:
            self._connect_streak = 0
