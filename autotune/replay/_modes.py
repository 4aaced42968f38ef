"""When each request is sent: closed loop, sessions, open-loop trace."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator, Sequence
from typing import TypeVar

from autotune.replay._run import Run
from autotune.workload.plan import PlannedRequest

T = TypeVar("T")
Round = tuple[str | None, str]  # (salt, record-id suffix)


def _rounds(run: Run) -> Iterator[Round]:
    """Round 0 as planned; later rounds (recycling) with a fresh salt each."""
    yield None, ""
    if run.recycling:
        for k in itertools.count(1):
            yield f"recycle-{k}", f"#{k}"


def _while_open(run: Run, units: Sequence[T]) -> Iterator[tuple[T, str | None, str]]:
    """Each unit (request or session) of each round, until the run closes."""
    if not units:
        return
    for salt, suffix in _rounds(run):
        for unit in units:
            if run.closed:
                return
            yield unit, salt, suffix


async def _concurrency(run: Run) -> None:
    """Closed loop: ``concurrency`` workers, requests in plan order."""
    items = _while_open(run, run.plan.requests)

    async def worker() -> None:
        for request, salt, suffix in items:
            if not run.may_send():
                return
            await run.send(request, salt=salt, record_id=request.id + suffix)

    await asyncio.gather(*(worker() for _ in range(run.load.concurrency)))


def _sessions_in_order(requests: tuple[PlannedRequest, ...]) -> list[list[PlannedRequest]]:
    groups: dict[str, list[PlannedRequest]] = {}
    for request in requests:
        key = request.session if request.session is not None else f"\0{request.id}"
        groups.setdefault(key, []).append(request)
    return list(groups.values())


async def _one_session(
    run: Run, requests: list[PlannedRequest], salt: str | None, suffix: str
) -> None:
    """Each request after its dependencies finish plus its gap; threads run side by side."""
    finished = {request.id: asyncio.Event() for request in requests}

    async def one(request: PlannedRequest) -> None:
        try:
            for dependency in request.after:
                if dependency in finished:
                    await finished[dependency].wait()
            if await run.wait(run.plan_wait_s(request.gap_s)) and run.may_send():
                await run.send(request, salt=salt, record_id=request.id + suffix)
        finally:
            finished[request.id].set()  # dependents go on (or skip) even if this one failed

    await asyncio.gather(*(one(request) for request in requests))


async def _sessions(run: Run) -> None:
    """``concurrency`` sessions at once, each replayed turn by turn."""
    sessions = _sessions_in_order(run.plan.requests)
    items = _while_open(run, sessions)

    async def worker() -> None:
        for session, salt, suffix in items:
            if not run.may_send():
                return
            await _one_session(run, session, salt, suffix)

    await asyncio.gather(*(worker() for _ in range(run.load.concurrency)))


async def _trace(run: Run) -> None:
    """Open loop: each request at its recorded arrival (scaled, gaps capped)."""
    ordered = sorted(run.plan.requests, key=lambda request: request.arrival_s)
    pending: set[asyncio.Task[object]] = set()
    at_wall_s = 0.0
    previous_arrival_s = ordered[0].arrival_s if ordered else 0.0
    try:
        for request in ordered:
            at_wall_s += run.plan_wait_s(request.arrival_s - previous_arrival_s)
            previous_arrival_s = request.arrival_s
            delay_s = run.origin + at_wall_s - time.perf_counter()
            if not await run.wait(delay_s) or not run.may_send():
                break
            run.claim()
            task = asyncio.create_task(run.send(request, claimed=True))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
    finally:  # cancelled from outside: no request outlives the replay
        for task in pending:
            task.cancel()


async def run_mode(run: Run) -> None:
    """Run the load mode ``run.load.mode`` to the end of its plan or budget."""
    modes = {"concurrency": _concurrency, "sessions": _sessions, "trace": _trace}
    await modes[run.load.mode](run)
