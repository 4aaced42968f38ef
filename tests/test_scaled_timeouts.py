"""The subprocess limits of the tests follow the machine's load (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import measured_slowdown


def test_a_loaded_machine_stretches_the_limits() -> None:
    """Busy processes, two per core, while a probe runs: the slowdown measured grows with
    them, as the tests' limits do (before: fixed 30 and 60 s)."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    try:
        loaded = measured_slowdown("sum(range(10**7))")  # a short probe, measured afresh
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert loaded > 1.5, loaded
