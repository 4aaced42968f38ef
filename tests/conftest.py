"""Subprocess time limits that follow this machine's load, and Ctrl-C as a terminal has it.

A limit that suits an idle machine fails a test on a loaded one (2 cores at load 10:
a CLI start-up of 15-25 s). ``scaled_timeout_s`` multiplies it by how slowed down this
machine is now, measured once per test process: the wall time of one start-up of the
CLI's heaviest command module over its CPU time (1 when idle, ~5 at load 10 on 2 cores).
"""

from __future__ import annotations

import functools
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A shell starts a background job (`pytest -n 2 &`, `nohup`, a script's `... &`) with
# SIGINT ignored, and every process inherits that: pytest-xdist's workers and what the
# tests start. The tests that interrupt a study, a server or the prediction workers with
# SIGINT would then see nothing happen (3 failed so). Python's own handler, back in this
# process (each xdist worker imports this file), is reset to the default in every child.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
PROBE = "import autotune.cli.run"  # the study, Optuna, pandas: a typical CLI start
PROBE_LIMIT_S = 600.0


def scaled_timeout_s(idle_s: float) -> float:
    """``idle_s`` (enough on an idle machine) times this machine's slowdown, at least 1."""
    return idle_s * max(1.0, slowdown())


@functools.cache
def slowdown() -> float:
    """Wall over CPU seconds of one CLI start-up, now: how much the load stretches work."""
    return measured_slowdown(PROBE)


def measured_slowdown(probe: str) -> float:
    """Wall over CPU seconds of ``python -c probe``, run now."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", probe], cwd=REPO, check=True, timeout=PROBE_LIMIT_S)
    wall_s = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall_s / max(cpu_s, 0.01)
