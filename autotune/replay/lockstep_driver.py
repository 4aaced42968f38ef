"""The HTTP driver in lockstep with the simulator: the replay moves the simulator's clock.

On the simulator engine a replay on scaled wall time measures the host as well as the
config: a busy CPU delays sends, steps and reads by wall milliseconds that the time
scale turns into modelled seconds. In lockstep (``autotune/sim/server/lockstep.py``, the
server's half) there is one clock, the simulator's, and this driver moves it:

- it sends what the load policy has due at the simulator's time ``now_s``, each request
  dated with its send time and numbered in order, then lets the simulator run to the
  next time it must look (the next send, /metrics scrape, request deadline or the end
  of the budget), or until one of its requests finishes;
- before it moves the clock again it reads every answer the simulator finished, and
  takes them in the order the engine ended them (then, for answers the engine never
  saw, by number), so what is sent next never depends on which stream the host
  happened to read first;
- times in the records are the simulator's own dates of its events; a request past its
  modelled timeout is cut at that modelled time (the simulator aborts it at once).

A trial's figures are then a function of the workload, the config and the seed; a
slow host makes the replay take longer on the wall clock, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from autotune.replay.client import STREAM_TIMEOUT, RequestOutcome
from autotune.replay.http_driver import HttpDriver
from autotune.replay.load_policy import Send
from autotune.replay.lockstep_wire import LOCKSTEP_PATH
from autotune.replay.records import RequestError, RequestRecord


@dataclass(eq=False)
class _Flight:
    send: Send
    seq: int
    task: asyncio.Task[None]
    deadline_s: float  # modelled, since the replay's start
    expired: bool = False


class LockstepDriver(HttpDriver):
    """One replay in lockstep with a simulator: ``await driver.run()``, then read ``records``.

    ``sample`` (when given) reads /metrics and judges saturation; it is called every
    ``scrape_interval_s`` modelled seconds, while the simulator holds still.
    """

    def __init__(
        self,
        *,
        sample: Callable[[], Awaitable[None]] | None = None,
        scrape_interval_s: float | None = None,
        **driver: Any,
    ) -> None:
        super().__init__(**driver)
        self._sample = sample
        self._scrape_interval_s = scrape_interval_s if sample is not None else None
        self._now_s = 0.0  # the simulator's clock, modelled seconds since the start
        self._seq = 0  # requests sent so far
        self._flights: dict[int, _Flight] = {}
        self._cancel: list[int] = []  # expired requests the simulator must abort
        self._landed: list[tuple[float, float, int, Send, RequestOutcome]] = []  # not taken
        self._ended = 0  # requests that ended here (the simulator's count must not pass it)
        self._ended_event = asyncio.Event()

    def now_s(self, wall_s: float | None = None) -> float:
        """Modelled seconds since the start: now, or at ``wall_s`` on the simulator's clock."""
        return self._now_s if wall_s is None else wall_s - self.origin

    def stop(self, reason: str) -> None:
        super().stop(reason)
        self._ended_event.set()

    async def run(self) -> None:
        """Send until the plan or the budget is spent and every request has ended."""
        policy = self.policy
        next_scrape_s = self._scrape_interval_s
        try:
            self.origin = float((await self._post(LOCKSTEP_PATH, {}))["now_s"])
            while policy.stop_reason is None:
                now_s = self._now_s
                self._expire(now_s)
                if self.load.duration_s is not None and now_s >= self.load.duration_s:
                    policy.close()
                self._dispatch(now_s)
                if next_scrape_s is not None and now_s >= next_scrape_s:
                    await self._advance(now_s)  # what was just sent reaches the engine first
                    while now_s >= next_scrape_s and policy.stop_reason is None:
                        assert self._sample is not None and self._scrape_interval_s is not None
                        await self._sample()
                        next_scrape_s += self._scrape_interval_s
                    continue
                next_send_s = policy.next_send_s()
                if next_send_s is None and self.in_flight == 0:
                    return
                await self._advance(self._horizon_s(next_send_s, next_scrape_s))
        except httpx.TransportError as exc:  # the server is gone (it died, it was stopped)
            self.stop(f"server unreachable: {type(exc).__name__} {exc}".strip())
        except httpx.HTTPStatusError as exc:  # it does not speak lockstep
            self.stop(f"lockstep with the simulator failed: {exc}")
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def release(self) -> None:
        """Give the simulator its clock back (scaled wall time again)."""
        with contextlib.suppress(httpx.HTTPError):
            await self.client.delete(LOCKSTEP_PATH)

    def _horizon_s(self, next_send_s: float | None, next_scrape_s: float | None) -> float | None:
        """The next time the replay must look, modelled (None: the next request's end)."""
        candidates = [math.inf]
        if next_send_s is not None:
            candidates.append(next_send_s)
        if next_scrape_s is not None:
            candidates.append(next_scrape_s)
        candidates += [flight.deadline_s for flight in self._flights.values()]
        if self.load.duration_s is not None and not self.policy.closed:
            candidates.append(self.load.duration_s)
        horizon_s = min(candidates)
        return None if math.isinf(horizon_s) else horizon_s

    def _dispatch(self, now_s: float) -> None:
        """Send, in order, what the policy has due by ``now_s``, each dated at its own time."""
        policy = self.policy
        while (at_s := policy.next_send_s()) is not None and at_s <= now_s:
            for send in policy.due(at_s):
                seq = self._seq
                self._seq += 1
                task = self._start_clocked(send, seq)
                deadline_s = send.at_s + self.load.request_timeout_s
                self._flights[seq] = _Flight(send, seq, task, deadline_s)

    def _start_clocked(self, send: Send, seq: int) -> asyncio.Task[None]:
        self.in_flight += 1
        task = asyncio.create_task(self._send_clocked(send, seq))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _send_clocked(self, send: Send, seq: int) -> None:
        try:
            outcome = await self._request(send, clocked_at_s=self.origin + send.at_s, seq=seq)
        except asyncio.CancelledError:
            flight = self._flights.get(seq)
            if flight is None or not flight.expired:
                raise
            return  # timed out in modelled time: _expire has recorded it
        finally:
            self.in_flight -= 1
        flight = self._flights.pop(seq, None)
        if flight is None or flight.expired:
            return
        order = math.inf if outcome.end_order is None else outcome.end_order
        self._landed.append((self.now_s(outcome.end_clock_s), order, seq, send, outcome))
        self._count_end()

    def _count_end(self) -> None:
        self._ended += 1
        self._ended_event.set()

    def _expire(self, now_s: float) -> None:
        """Requests past their modelled timeout end now; the simulator aborts them."""
        for seq, flight in sorted(self._flights.items()):
            if flight.deadline_s > now_s or flight.expired:
                continue
            flight.expired = True
            flight.task.cancel()
            del self._flights[seq]
            self._cancel.append(seq)
            self._count_end()
            timeout_s = self.load.request_timeout_s
            record = RequestRecord(
                id=flight.send.record_id,
                session=flight.send.request.session,
                endpoint=flight.send.request.endpoint,
                send_s=flight.send.at_s,
                e2e_s=now_s - flight.send.at_s,
                error=RequestError.TIMEOUT,
                error_detail=f"no complete answer within {timeout_s:g}s",
            )
            outcome = RequestOutcome(
                record=record, gaps_s=np.zeros(0), end_clock_s=self.origin + now_s
            )
            self._record(flight.send, outcome)

    async def _advance(self, until_s: float | None) -> None:
        """Let the simulator run to ``until_s`` (or its next end); take what ended meanwhile."""
        body = {
            "until_s": None if until_s is None else self.origin + until_s,
            "sent": self._seq,
            "cancel": self._cancel,
        }
        self._cancel = []
        reply = await self._post(f"{LOCKSTEP_PATH}/advance", body)
        if reply.get("dead"):
            self.stop("the simulated engine died")
            return
        self._now_s = max(self._now_s, float(reply["now_s"]) - self.origin)
        while self._ended < int(reply["ended"]) and self.policy.stop_reason is None:
            self._ended_event.clear()
            await self._ended_event.wait()
        landed, self._landed = sorted(self._landed, key=lambda item: item[:3]), []
        for *_, send, outcome in landed:
            self._record(send, outcome)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        # An advance is answered when the simulator holds again, which may take as long as
        # the span it runs: reads unbounded, as a stream's (the trial's limit is the backstop).
        response = await self.client.post(path, json=body, timeout=STREAM_TIMEOUT)
        response.raise_for_status()
        return dict(response.json())
