"""The simulator-steered search end to end: the real CLI, real simulator processes.

Warm-start seeds after the baseline, no effective config launched twice,
confirmation re-measurements before the crown.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD, autotune_argv, trial_logs

SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"
DEDUP = REPO / "tests" / "e2e" / "data" / "tuner-dedup.yaml"
FAST = ["--time-scale", "50", "--max-requests", "10", "--concurrency", "4"]


def run(tmp_path: Path, space: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list]:
    db = tmp_path / "studies" / "autotune.db"
    result = subprocess.run(
        autotune_argv(
            "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
            "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq",
            "--space", str(space), "--storage", f"sqlite:///{db}", "--study", "t",
            "--seed", "1", *FAST, *extra,
        ),
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{db}")
    return result, study


def launch_key(trial: optuna.trial.FrozenTrial) -> str:
    return json.dumps(trial.user_attrs["config"]["flags"], sort_keys=True)


@pytest.mark.timeout(420)
def test_guided_run_seeds_from_predictions_never_relaunches_and_confirms(tmp_path: Path) -> None:
    result, study = run(tmp_path, SMALL, "--trials", "6", "--warm-start", "3", "--confirm", "2")
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert trials[0].user_attrs["is_baseline"]
    seeds = [t for t in trials if t.user_attrs.get("warm_start")]
    assert [t.user_attrs["warm_start"] for t in seeds] == [1, 2, 3]
    assert [t.number for t in seeds] == [1, 2, 3]  # right after the baseline
    assert len({launch_key(t) for t in seeds}) == 3
    # Every launch outside confirmation is a config not launched before.
    launched = [t for t in trials if t.user_attrs.get("measured")]
    searched = [t for t in launched if t.user_attrs.get("confirms") is None]
    assert len({launch_key(t) for t in searched}) == len(searched)
    # Two confirmation launches re-measure earlier configs; the crown cites its measurements.
    confirms = [t for t in trials if t.user_attrs.get("confirms") is not None]
    assert len(confirms) == 2
    for trial in confirms:
        original = study.trials[trial.user_attrs["confirms"]]
        assert launch_key(trial) == launch_key(original)
    logs = trial_logs(tmp_path / "studies" / "runs")
    assert all(t.number in logs for t in confirms)  # really launched
    winner = study.user_attrs["winner"]
    assert winner["trial"] in [t.number for t in searched]
    warm = study.user_attrs["warm_start"]
    assert warm["effective_configs"] == 30 and warm["seeds"] == 3  # 36 points, 30 fit
    assert "warm start: 30 effective configs fit" in result.stdout
    assert "measured 2 times" in result.stdout or winner["measurements"] == 1


@pytest.mark.timeout(420)
def test_a_repeated_effective_config_is_answered_without_a_launch(tmp_path: Path) -> None:
    # Random search over six points that are three launchable configs (+1 predicted OOM):
    # eight trials must repeat, and a repeat launches nothing.
    _, study = run(tmp_path, DEDUP, "--trials", "8", "--sampler", "random", "--confirm", "0")
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    duplicates = [t for t in trials if t.user_attrs.get("outcome") == "duplicate"]
    assert duplicates
    logs = trial_logs(tmp_path / "studies" / "runs")
    assert not any(t.number in logs for t in duplicates)
    launched = [t for t in trials if t.number in logs]
    assert len({launch_key(t) for t in launched}) == len(launched)
    for trial in duplicates:
        original = study.trials[trial.user_attrs["duplicate_of"]]
        assert trial.value == original.value
