"""The simulator-steered search end to end: the real CLI, real simulator processes.

Warm-start seeds after the baseline, no effective config launched twice,
confirmation re-measurements before the crown.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.trial.record import TrialRecord
from autotune.tuner.record import TunerStudyRecord
from tests.e2e.conftest import (
    REPO,
    SAMPLE_WORKLOAD,
    autotune_argv,
    output,
    trial_logs,
    tuner_args,
    wait_for,
)

SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"
DEDUP = REPO / "tests" / "e2e" / "data" / "tuner-dedup.yaml"
FAST = {"simulator": {"time_scale": 200}, "load": {"max_requests": 10}, "seed": 1}


def fast(tmp_path: Path, settings: dict | None = None) -> list[str]:
    """``--concurrency 4`` and ``--tuner FILE``: seed 1, FAST, then ``settings``."""
    return ["--concurrency", "4", *tuner_args(tmp_path / "settings", FAST, settings or {})]


def run(
    tmp_path: Path, space: Path, *extra: str, settings: dict | None = None
) -> tuple[subprocess.CompletedProcess, list]:
    db = tmp_path / "studies" / "autotune.db"
    result = subprocess.run(
        autotune_argv(
            "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
            "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq",
            "--space", str(space), "--storage", f"sqlite:///{db}", "--study", "t",
            *fast(tmp_path, settings), *extra,
        ),
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{db}")
    return result, study


def record(trial: optuna.trial.FrozenTrial) -> TrialRecord:
    return TrialRecord.read(trial.user_attrs)


def launch_key(trial: optuna.trial.FrozenTrial) -> str:
    return json.dumps(record(trial).config.flags, sort_keys=True)


@pytest.mark.timeout(420)
def test_guided_run_seeds_from_predictions_never_relaunches_and_confirms(tmp_path: Path) -> None:
    # Seeds in their order (overtaking reorders them once one is measured: tests/tuner).
    # The tail re-measures only: with the explore tail on, whether it launches a new config
    # instead turns on how the real server's runs came out (tests/tuner covers that rule).
    result, study = run(
        tmp_path, SMALL, "--trials", "6",
        settings={"warm_start": 3, "confirm": 2, "overtake": False, "explore_tail": False},
    )  # fmt: skip
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert record(trials[0]).is_baseline
    seeds = [t for t in trials if record(t).warm_start]
    assert [record(t).warm_start for t in seeds] == [1, 2, 3]
    assert [t.number for t in seeds] == [1, 2, 3]  # right after the baseline
    assert len({launch_key(t) for t in seeds}) == 3
    # Every launch outside confirmation is a config not launched before.
    launched = [t for t in trials if record(t).measured]
    searched = [t for t in launched if record(t).confirms is None]
    assert len({launch_key(t) for t in searched}) == len(searched)
    # Two confirmation launches re-measure earlier configs; the crown cites its measurements.
    confirms = [t for t in trials if record(t).confirms is not None]
    assert len(confirms) == 2
    for trial in confirms:
        original = study.trials[record(trial).confirms]
        assert launch_key(trial) == launch_key(original)
    logs = trial_logs(tmp_path / "studies" / "runs")
    assert all(t.number in logs for t in confirms)  # really launched
    tuner = TunerStudyRecord.read(study.user_attrs)
    winner, warm = tuner.winner, tuner.warm_start
    assert winner is not None and warm is not None
    assert winner.trial in [t.number for t in searched]
    assert warm.effective_configs == 30 and warm.seeds == 3  # 36 points, 30 fit
    assert "warm start: 30 effective configs fit" in result.stdout
    assert "measured 2 times" in result.stdout or winner.measurements == 1
    # The last trial's line quotes the crown the summary hands over, by its mean.
    summary = re.search(r"Best: trial (\d+): ([\d,.]+) output_tok_s", result.stdout)
    lines = re.findall(r"; best ([\d,.]+) output_tok_s \(#(\d+)[,)]", result.stdout)
    assert summary and lines and lines[-1] == (summary[2], summary[1]), result.stdout
    # Each line says why the tuner launched the trial.
    for trial in seeds:
        rank = record(trial).warm_start
        assert re.search(
            rf"trial {trial.number} \[\d/6\] [\w-]+ \(warm start {rank}\):", result.stdout
        )
    for trial in confirms:
        original = record(trial).confirms
        assert re.search(
            rf"trial {trial.number} \[\d/6\] [\w-]+ \(re-measures #{original}\):", result.stdout
        )


@pytest.mark.timeout(420)
def test_a_repeated_effective_config_is_answered_without_a_launch(tmp_path: Path) -> None:
    # Random search over six points that are three launchable configs (+1 predicted OOM):
    # eight trials must repeat, and a repeat launches nothing.
    _, study = run(tmp_path, DEDUP, "--trials", "8", "--sampler", "random", settings={"confirm": 0})
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    duplicates = [t for t in trials if record(t).outcome == "duplicate"]
    assert duplicates
    logs = trial_logs(tmp_path / "studies" / "runs")
    assert not any(t.number in logs for t in duplicates)
    launched = [t for t in trials if t.number in logs]
    assert len({launch_key(t) for t in launched}) == len(launched)
    for trial in duplicates:
        original = study.trials[record(trial).duplicate_of]
        assert trial.value == original.value


@pytest.mark.timeout(420)
def test_with_dedup_off_a_repeated_effective_config_is_launched_again(tmp_path: Path) -> None:
    """``dedup: false`` in --tuner FILE: the same random draws launch repeats (before: the
    option --no-dedup; no settings file)."""
    _, study = run(
        tmp_path, DEDUP, "--trials", "6", "--sampler", "random",
        settings={"confirm": 0, "dedup": False},
    )  # fmt: skip
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert not [t for t in trials if record(t).outcome == "duplicate"]
    logs = trial_logs(tmp_path / "studies" / "runs")
    launched = [launch_key(t) for t in trials if t.number in logs]
    assert len(set(launched)) < len(launched), launched  # some config launched twice
    assert study.user_attrs["tuner"]["dedup"] is False


def no_waiting(study: optuna.Study) -> None:
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert not waiting, [(t.number, t.user_attrs) for t in waiting]


@pytest.mark.timeout(420)
def test_trials_is_the_whole_budget_with_seeds_and_confirmations_inside(tmp_path: Path) -> None:
    # Defaults (warm start 4, confirm 3): --trials 1 runs the baseline alone. The tail
    # re-measures only: with the explore tail on, whether it launches a new config instead
    # turns on how the real server's runs came out (tests/tuner covers that rule).
    plain_tail = {"overtake": False, "explore_tail": False}
    result, study = run(tmp_path, SMALL, "--trials", "1", settings=plain_tail)
    assert len(study.trials) == 1 and record(study.trials[0]).is_baseline
    assert "[1/1]" in result.stdout and "[2/1]" not in result.stdout
    no_waiting(study)
    # Resumed to 7: baseline, 3 seeds, 3 re-measurements; nothing left enqueued.
    result, study = run(tmp_path, SMALL, "--trials", "7", settings=plain_tail)
    assert len(study.trials) == 7
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert "[8/7]" not in result.stdout
    no_waiting(study)
    roles = [(record(t).warm_start, record(t).confirms) for t in study.trials]
    assert [rank for rank, _ in roles[1:4]] == [1, 2, 3]
    assert all(confirms is not None for _, confirms in roles[4:])


@pytest.mark.timeout(420)
def test_a_killed_study_resumes_to_exactly_its_budget(tmp_path: Path, spawn) -> None:
    db = tmp_path / "studies" / "autotune.db"
    args = [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq",
        "--space", str(SMALL), "--storage", f"sqlite:///{db}", "--study", "t",
        "--trials", "6", "--heartbeat-interval", "1", *fast(tmp_path),
    ]  # fmt: skip
    process = spawn(*args, cwd=tmp_path)

    def seeding() -> bool:  # a warm-start seed's server is up
        return any(n >= 2 for n in trial_logs(tmp_path / "studies" / "runs"))

    assert wait_for(seeding, timeout_s=200), output(tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    rerun = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{db}")
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 6
    no_waiting(study)
    assert len(study.get_trials(states=(TrialState.FAIL,))) == 1  # the killed trial
    assert TunerStudyRecord.read(study.user_attrs).winner is not None


@pytest.mark.timeout(420)
def test_an_slo_out_of_reach_is_said_in_stdout_redirected_to_a_file(tmp_path: Path) -> None:
    db = tmp_path / "studies" / "autotune.db"
    log = tmp_path / "run.log"
    with log.open("w") as stdout:
        done = subprocess.run(
            autotune_argv(
                "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
                "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq",
                "--space", str(SMALL), "--storage", f"sqlite:///{db}", "--study", "t",
                *fast(tmp_path), "--trials", "3", "--slo", "ttft_p95<=10ms",
            ),
            cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=400,
        )  # fmt: skip
    text = log.read_text()
    assert done.returncode == 0, text + done.stderr
    line = next(x for x in text.splitlines() if "No configuration is predicted to meet" in x)
    assert "ttft_p95<=10ms: the best predicted p95 TTFT is" in line
    assert "relax the SLO or slice the workload" in line
    assert "none of 30 configs was predicted to meet the limits either" in text
    # The seeds after the baseline are the nearest configs, each launched (none predicted-OOM).
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{db}")
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert [record(t).warm_start for t in trials[1:]] == [1, 2]
    assert all(record(t).outcome == "slo-violated" for t in trials)
    assert set(trial_logs(tmp_path / "studies" / "runs")) == {0, 1, 2}
