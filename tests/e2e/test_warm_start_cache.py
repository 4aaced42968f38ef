"""The warm start's predictions are made once: a resume reads them from the study,
another study of the same workload from the disk cache. The real CLI, real servers."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import optuna
import pytest

from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD, autotune_argv, tuner_args

SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"  # 36 points, 30 fit
FAST = {"seed": 1, "simulator": {"time_scale": 200}, "load": {"max_requests": 10}}
CACHE_ENV = "AUTOTUNE_PREDICTION_CACHE"  # as a user sets it (tuner/prediction_cache.py)
STUDY_ATTR = "warm_start_predictions"  # as docs/architecture.md names it


def run(tmp_path: Path, study: str, trials: int, **env: str) -> str:
    db = tmp_path / "studies" / "autotune.db"
    result = subprocess.run(
        autotune_argv(
            "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
            "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq",
            "--space", str(SMALL), "--storage", f"sqlite:///{db}", "--study", study,
            "--trials", str(trials), "--concurrency", "4", *tuner_args(tmp_path / "settings", FAST),
        ),
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.timeout(400)
def test_the_warm_start_is_predicted_once_then_read_back(tmp_path: Path) -> None:
    first = run(tmp_path, "a", 1)
    assert "Warm start: screening 30 configs" in first, first
    replayed = int(re.search(r"Warm start: screened 30 configs, replayed (\d+)", first)[1])  # type: ignore[index]
    # Resumed with the disk cache off: the study alone hands the replays back.
    resumed = run(tmp_path, "a", 2, **{CACHE_ENV: "off"})
    assert "Warm start: screened" not in resumed, resumed
    assert (tmp_path / "studies" / "cache" / "predictions.sqlite").is_file()
    storage = f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    stored = optuna.load_study(study_name="a", storage=storage).user_attrs[STUDY_ATTR]
    assert stored["count"] >= replayed  # the warm start's replays (and the trials' settling)
    assert "30 effective configs that fit" in resumed
    assert "of the replays from the prediction cache)" in resumed
    assert "trial 1 [2/2]" in resumed  # and the study went on
    # Another study of the same workload, space and goal: the disk cache hands them back.
    other = run(tmp_path, "b", 1)
    assert "Warm start: screened" not in other, other
    assert "of the replays from the prediction cache)" in other
