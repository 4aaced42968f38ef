"""`autotune show` puts the workload's ideal prefix hit beside the server's."""

from __future__ import annotations

from typer.testing import CliRunner

from autotune.cli import app
from autotune.workload.expand import load_plan
from autotune.workload.stats import workload_stats
from tests.results.conftest import SAMPLE_WORKLOAD, build_study, on_the_catalog_gpu


def _show(storage_url: str) -> str:
    result = CliRunner().invoke(
        app, ["show", "--storage", storage_url, "--study", "s"], env={"COLUMNS": "250"}
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def test_show_prints_the_ideal_prefix_hit_of_the_study_workload(storage_url: str) -> None:
    build_study(storage_url, "s")
    on_the_catalog_gpu(storage_url, "s")
    ideal = workload_stats(load_plan(SAMPLE_WORKLOAD), block_size=16).prefix_hit_ratio
    shown = _show(storage_url)
    assert "ideal hit" in shown
    assert f"{100 * ideal:.1f}%" in shown
    assert "45.0%" in shown  # the server's own hit rate, beside it
    assert "ideal hit: unknown" not in shown


def test_show_says_when_the_workload_file_changed(storage_url: str) -> None:
    build_study(storage_url, "s")  # its stored digest is not the file's
    shown = _show(storage_url)
    assert "ideal hit: unknown (the study's workload file is gone or changed)" in shown
