"""Ctrl-C and SIGTERM land inside a trial, never between two.

Optuna creates the next trial (RUNNING in storage) before it calls the
objective. An interrupt in that gap, while the sampler proposes, left a
RUNNING trial that nothing recorded or retried: a ``kill -9`` of
``run --gpus`` sends every worker SIGTERM at a random moment (seen on CI).
Between trials the signal only sets a flag; the next trial raises it as its
first act, where the runner records the trial as interrupted and re-enqueues
its config, or the loop raises it when it ends.

An interrupt can also be lost outright: Python runs a signal's handler at the next
bytecode of the main thread, and when that bytecode is inside a weakref callback, a
``__del__`` or a fork hook, the KeyboardInterrupt it raises is printed ("Exception
ignored in ...") and dropped; the run went on as if Ctrl-C had never been pressed (seen
on CI). ``redeliver_swallowed_interrupts`` sends such an interrupt again.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import optuna
from optuna.trial import FrozenTrial

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long a dropped interrupt waits to be sent again: time for the code that dropped
# it (a weakref callback, the unraisable hook) to return.
REDELIVERY_DELAY_S = 0.01


class BetweenTrials:
    """Holds interrupts from the end of one trial to the start of the next."""

    def __init__(self) -> None:
        self.held = False
        self.pending = False

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Around ``study.optimize``: interrupts before the first trial's start are held.

        Only signals whose handler is Python's (Ctrl-C's KeyboardInterrupt, the CLI's
        SIGTERM) are touched, and only on the main thread, where Python runs handlers.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in HELD_SIGNALS}
        ours = [sig for sig, handler in previous.items() if callable(handler)]

        def hold_or_raise(signum: int, frame: Any) -> None:
            if self.held:
                self.pending = True
            else:
                previous[signum](signum, frame)

        for sig in ours:
            signal.signal(sig, hold_or_raise)
        self.held = True
        try:
            yield
        finally:
            self.held = False
            for sig in ours:
                signal.signal(sig, previous[sig])
        self.raise_pending()

    def trial_started(self) -> None:
        """The objective's first act: interrupts reach the trial from here on."""
        self.held = False
        self.raise_pending()

    def trial_ended(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """An Optuna callback: hold interrupts until the next trial starts."""
        self.held = True

    def raise_pending(self) -> None:
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt


def redeliver_swallowed_interrupts() -> None:
    """From now on, a KeyboardInterrupt that Python drops as unraisable (see the module
    docstring) is delivered again: SIGINT to the main thread, from a helper thread once
    the code that dropped it has returned (a handler run inside this hook would be
    dropped too). Other unraisable exceptions go to the hook before."""
    previous = sys.unraisablehook
    main = threading.main_thread().ident
    assert main is not None

    def deliver() -> None:
        time.sleep(REDELIVERY_DELAY_S)
        signal.pthread_kill(main, signal.SIGINT)

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            threading.Thread(target=deliver, name="redeliver-interrupt", daemon=True).start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
