"""``autotune --help`` imports no command module: plotly, pandas, Optuna, SQLAlchemy and
the simulator stay unloaded, and the listing (from ``cli/_lazy.py``'s table) is the one the commands
themselves give."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

import autotune
from autotune.cli import app
from autotune.cli._lazy import COMMANDS
from tests.conftest import scaled_timeout_s

HEAVY = ("plotly", "pandas", "optuna", "scipy", "numpy", "sqlalchemy", "uvicorn", "starlette")
LOADED_AFTER = """
import runpy, sys
sys.argv = ["autotune", *sys.argv[1:]]
try:
    runpy.run_module("autotune", run_name="__main__")
except SystemExit:
    pass
print("loaded:", " ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


def loaded_after(*args: str) -> set[str]:
    """The top-level packages a real ``python -m autotune ARGS`` imported."""
    done = subprocess.run(
        [sys.executable, "-c", LOADED_AFTER, *args],
        capture_output=True, text=True, timeout=scaled_timeout_s(60),
        cwd=Path(autotune.__file__).parents[1],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [text for text in done.stdout.splitlines() if text.startswith("loaded:")]
    return set(line.split()[1:])


def test_help_imports_no_heavy_package() -> None:
    """Before: every command module was imported for ``--help`` (5 s at load 10)."""
    assert loaded_after("--help").isdisjoint(HEAVY)


def test_a_workload_command_imports_no_study() -> None:
    """Before: every command imported the study package (Optuna, pandas, SQLAlchemy) for
    ``--storage``'s parser, also to print a one-line error about a workload file."""
    loaded = loaded_after("workload", "stats", "/nonexistent.jsonl")
    assert loaded.isdisjoint(("plotly", "pandas", "optuna", "scipy", "sqlalchemy")), loaded


def test_a_command_imports_what_it_needs() -> None:
    assert "optuna" in loaded_after("show", "--help")


def help_text(group: Any, capsys: pytest.CaptureFixture[str]) -> str:
    group.main(["--help"], prog_name="autotune", standalone_mode=False)
    return capsys.readouterr().out


def test_the_listing_is_the_commands_own(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    lazy = help_text(typer.main.get_command(app), capsys)
    group = typer.main.get_command(app)
    for name in COMMANDS:
        group.load(name)  # type: ignore[attr-defined]  # a LazyCommands group
    assert "run" in lazy and lazy == help_text(group, capsys)
