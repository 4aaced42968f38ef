"""Every script under scripts/ that takes options answers ``--help`` with its usage: a
help text argparse cannot format (a bare ``%``, say) fails only when someone asks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
WITH_OPTIONS = sorted(
    path for path in SCRIPTS.glob("*.py") if "ArgumentParser(" in path.read_text()
)


def test_the_scripts_with_options_are_found() -> None:
    assert SCRIPTS / "bench_tuner.py" in WITH_OPTIONS


@pytest.mark.parametrize("script", WITH_OPTIONS, ids=lambda path: path.name)
def test_a_script_prints_its_usage(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:")
