"""A Ctrl-C whose KeyboardInterrupt Python drops (raised inside a weakref callback: CI
once saw a run go on through it) is delivered again and stops the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# The signal arrives while a weakref callback runs: its handler raises there, and Python
# prints and drops the KeyboardInterrupt. The script then carries on unless redelivered.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time, weakref
    from autotune.study.between_trials import redeliver_swallowed_interrupts

    if sys.argv[1] == "redeliver":
        redeliver_swallowed_interrupts()

    class Held:
        pass

    def on_collected(ref):
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # the handler runs at one of these bytecodes

    held = Held()
    ref = weakref.ref(held, on_collected)
    try:
        del held
        time.sleep(3)  # the run goes on: a redelivered interrupt stops it here
    except KeyboardInterrupt:
        print("interrupted")
        sys.exit(130)
    print("went on")
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "expected"), [("plain", "went on"), ("redeliver", "interrupted")])
def test_an_interrupt_dropped_in_a_weakref_callback_is_delivered_again(
    mode: str, expected: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=50
    )
    assert result.stdout.strip() == expected, result.stdout + result.stderr
    assert "KeyboardInterrupt" in result.stderr or mode == "redeliver", result.stderr
    assert result.returncode == (130 if mode == "redeliver" else 0), result.stderr
