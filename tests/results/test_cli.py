"""The result commands through typer (parsing, errors as one line, exit codes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from autotune.cli import app as full_app  # show is `run`'s sibling, not a results command
from autotune.cli.results import register
from tests.results.conftest import Point, build_study

runner = CliRunner()
app = typer.Typer()  # only our commands: the test does not depend on the rest of the CLI
register(app)


def test_report_explain_compare_run_on_a_stored_study(study_url: str, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", "--storage", study_url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("<!DOCTYPE html>")
    result = runner.invoke(app, ["explain", "--storage", study_url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Where out-of-memory begins" in result.stdout
    result = runner.invoke(
        app,
        ["compare", "qwen-4080", "--storage", study_url, "--price", "rtx 4080=0.5"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "4,377,600" in result.stdout


def test_errors_are_one_line_and_exit_2(study_url: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["compare", "qwen-4080", "--storage", study_url, "--price", "x"])
    assert result.exit_code == 2
    assert "--price 'x': expected GPU=USD_PER_HOUR" in result.output
    result = runner.invoke(app, ["explain", "--storage", study_url, "--study", "nope"])
    assert result.exit_code == 2
    assert "--study 'nope': not in" in result.output
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    result = runner.invoke(app, ["report", "--storage", missing])
    assert result.exit_code == 2
    assert "does not exist" in result.output
    assert not (tmp_path / "missing.db").exists()


def test_dashboard_prints_its_command(study_url: str) -> None:
    result = runner.invoke(app, ["dashboard", "--storage", study_url, "--print", "--port", "9001"])
    assert result.exit_code == 0, result.output
    assert "optuna-dashboard" in result.stdout
    assert "--port 9001" in result.stdout


def test_show_explains_its_margin_column(study_url: str) -> None:
    """Before: an `oom -0.08` column with no word on what it measures."""
    result = runner.invoke(full_app, ["show", "--storage", study_url], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert re.search(r"oom -\d\.\d\d", result.stdout), result.stdout
    assert (
        "margin: the limit that decides the trial, as measured / limit - 1 (oom: memory "
        "needed / available - 1; slo:NAME: the SLO's): below 0 within it, above 0 past it"
    ) in result.stdout


def test_explain_counts_one_oom_trial_in_words(storage_url: str) -> None:
    """Before: "1 trial(s) ran out of memory (0)"."""
    build_study(storage_url, "one-oom", points=[
        Point(6.0, "auto", 16, 0, baseline=True), Point(14.0, "fp8_e4m3", 32, 2),
    ])  # fmt: skip
    result = runner.invoke(
        app, ["explain", "--storage", storage_url, "--study", "one-oom"], env={"COLUMNS": "400"}
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "1 trial ran out of memory (trial 1), but none differs" in text, text


def test_show_into_a_file_keeps_every_cell_whole(study_url: str, tmp_path: Path) -> None:
    """Before: stdout to a file was 80 columns and cut the table's cells ("kv_cache_m…")."""
    out = tmp_path / "show.txt"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    with out.open("w") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "autotune", "show", "--storage", study_url],
            stdout=stdout, stderr=subprocess.PIPE, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) > 80, text


def test_compare_what_if_prints_each_gpus_published_fidelity(storage_url: str) -> None:
    from tests.results.conftest import on_the_catalog_gpu

    build_study(storage_url, "a", points=[Point(6.0, "auto", 8, 0, baseline=True)])
    on_the_catalog_gpu(storage_url, "a")
    result = runner.invoke(
        app,
        ["compare", "a", "--storage", storage_url, "--what-if", "rtx4080s-32g"],
        env={"COLUMNS": "250"},
    )
    assert result.exit_code == 0, result.output
    assert "rtx4080s-32g: no published run checked; constants: " in result.stdout
