"""A warm start held to its budget in configs says so, in the summary and in `show`
("predicted N of M"), and a resume says what it predicted itself, not the first run's
figures. The real CLI, real simulated servers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD, autotune_argv, tuner_args

SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"  # 36 points, 30 fit
SETTINGS = {
    "seed": 1,
    "warm_start_configs": 10,
    "simulator": {"time_scale": 200},
    "load": {"max_requests": 10},
}


def autotune(tmp_path: Path, *args: str) -> str:
    result = subprocess.run(
        autotune_argv(*args, "--storage", f"sqlite:///{tmp_path / 'studies' / 'a.db'}"),
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def run(tmp_path: Path, trials: int) -> str:
    return autotune(
        tmp_path, "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(SMALL),
        "--trials", str(trials), "--concurrency", "4",
        *tuner_args(tmp_path / "settings", SETTINGS),
    )  # fmt: skip


@pytest.mark.timeout(400)
def test_a_warm_start_cut_by_its_budget_says_so_and_a_resume_says_what_it_did(
    tmp_path: Path,
) -> None:
    cut = "warm start: predicted 10 of 30 effective configs that fit; the other 20 were never"
    first = run(tmp_path, 1)
    assert "Warm start: predicting 10 configs on the simulator ..." in first
    assert cut in first and "this run predicted 10," not in first, first
    assert "; this run predicted 10;" in first
    shown = autotune(tmp_path, "show")
    assert cut in shown and "this run predicted 10" in shown, shown
    resumed = run(tmp_path, 2)
    assert "Warm start: predicting" not in resumed  # the study hands the 10 back
    assert cut in resumed and "this run predicted 0 (10 were stored)" in resumed, resumed
