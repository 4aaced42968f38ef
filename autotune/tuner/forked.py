"""Worker processes forked from autotune for the tuner's CPU-bound work (the warm
start's enumeration and predictions): results in order, as a serial loop gives them.

Each worker inherits the state it needs at the fork (nothing is pickled but the items
and the results), dies with autotune (PR_SET_PDEATHSIG: a ``kill -9`` of autotune leaves
none behind) and leaves Ctrl-C and SIGTERM to it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from autotune.engines.process import child_preexec, interrupt_after_forks

MAX_WORKERS = 8

Item = TypeVar("Item")
Result = TypeVar("Result")

_STATE: Any = None  # what the parent handed this worker at the fork


def default_workers() -> int:
    """One worker per CPU this process may run on (at most ``MAX_WORKERS``)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


def worker_state() -> Any:
    """The state ``forked_map`` handed this worker."""
    return _STATE


def _init_worker(state: Any, die_with_parent: Callable[[], None] | None) -> None:
    global _STATE
    _STATE = state
    if die_with_parent is not None:  # a kill -9 of autotune leaves no worker
        die_with_parent()
    # Ctrl-C and SIGTERM are the parent's to handle: no traceback from every worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def forked_map(
    function: Callable[[Item], Result],
    items: Sequence[Item],
    *,
    state: Any,
    workers: int,
    deadline: float | None = None,
) -> Iterator[Result]:
    """``function`` of every item, in order, on ``workers`` forked processes that see
    ``state`` through ``worker_state()``; a consumer that stops early leaves the items
    not yet started undone. At ``deadline`` (a ``time.monotonic()`` value) the results
    end: the items not started are cancelled, those under way finish (one per worker)."""
    context = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_init_worker,
        initargs=(state, child_preexec()),
    )
    try:
        with interrupt_after_forks():  # the first submit forks every worker
            futures = [pool.submit(function, item) for item in items]
        for future in futures:
            left_s = None if deadline is None else deadline - time.monotonic()
            try:
                found = future.result(timeout=left_s if left_s is None else max(0.0, left_s))
            except TimeoutError:
                return
            yield found
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
