"""A warm start's short list held to a count says so, in the summary and in `show`
("replayed N"), and a resume says what it replayed itself, not the first run's figures.
The real CLI, real simulated servers."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD, autotune_argv, tuner_args

SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"  # 36 points, 30 fit
SETTINGS = {
    "seed": 1,
    "warm_start_configs": 2,
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
    first = run(tmp_path, 1)
    assert "the replay judging the best 2 distinct predictions" in first, first
    replayed = int(re.search(r"all screened, (\d+) replayed", first)[1])  # type: ignore[index]
    assert 2 <= replayed < 30  # the short list and its climb, not the lattice
    summary = f"warm start: 30 effective configs fit, all screened, {replayed} replayed"
    assert summary in first and f"; this run replayed {replayed}" in first, first
    shown = autotune(tmp_path, "show")
    assert summary in shown and f"this run replayed {replayed}" in shown, shown
    resumed = run(tmp_path, 2)
    assert "Warm start: screened" not in resumed  # the study hands the replays back
    assert f"this run replayed 0 ({replayed} were stored)" in resumed, resumed
