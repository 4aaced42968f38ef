"""The fault suite: each fault the simulator injects, inside a real `autotune run`.

A fault schedule (one line of ``--fault-*`` flags per server launch) faults the
study trial by trial. For each fault: the expected outcome class is stored, the
study goes on to its budget, the stored study reads back consistent through
Optuna and through ``results.reader``, and no process is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.results.reader import load_study
from autotune.sim.server.faults import FAULT_SCHEDULE_ENV
from autotune.trial.record import TrialRecord
from tests.e2e.conftest import (
    REPO,
    SAMPLE_WORKLOAD,
    autotune_argv,
    output,
    processes_in,
    tuner_args,
    wait_for,
)

FITS_SPACE = REPO / "tests" / "e2e" / "data" / "fits.yaml"


def run_args(db: Path, trials: int, *extra: str) -> list[str]:
    return [
        "run",
        "--workload", str(SAMPLE_WORKLOAD),
        "--engine", "sim",
        "--hardware", "rtx4080s-32g",
        "--model", "qwen3.6-27b-awq",
        "--space", str(FITS_SPACE),
        "--storage", f"sqlite:///{db}",
        "--study", "faults",
        "--sampler", "random", "--concurrency", "4",
        *tuner_args(db.parent, {
            "dedup": False, "warm_start": 0, "confirm": 0, "seed": 1,
            "simulator": {"time_scale": 50}, "load": {"max_requests": 8},
            "engine": {"startup_timeout_s": 5},
        }),
        "--trials", str(trials),
        *extra,
    ]  # fmt: skip


def run_with_faults(tmp_path: Path, schedule: list[str], *extra: str) -> subprocess.Popen:
    """`autotune run` with one schedule line per launch; returns the finished process."""
    path = tmp_path / "faults.txt"
    path.write_text("\n".join(schedule) + "\n")
    env = {**os.environ, FAULT_SCHEDULE_ENV: str(path), "COLUMNS": "200"}
    trials = sum(1 for line in schedule if "gpu-memory-held" not in line)
    argv = autotune_argv(*run_args(tmp_path / "autotune.db", trials, *extra))
    with (tmp_path / "autotune.out").open("w") as out:
        process = subprocess.Popen(
            argv, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env
        )
        process.wait(timeout=280)
    return process


def assert_consistent(tmp_path: Path, trials: int) -> list[str]:
    """The study as Optuna and results.reader see it; the outcomes in trial order."""
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    study = optuna.load_study(study_name="faults", storage=url)
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE] * trials, states  # none lost, none left running
    loaded = load_study(url, "faults")
    assert [row.number for row in loaded.trials] == list(range(trials))
    assert all(row.outcome for row in loaded.trials)
    assert loaded.best().outcome == "ok"  # the clean baseline still crowns
    assert processes_in(tmp_path) == []  # no server, watchdog or helper outlives the run
    return [row.outcome for row in loaded.trials]


@pytest.mark.timeout(120)
def test_replay_faults_are_trial_outcomes_and_the_study_goes_on(tmp_path: Path) -> None:
    """5xx, malformed SSE and an engine crash mid-replay: classified, nothing lost."""
    schedule = [
        "",
        "--fault-5xx-rate 0.5",
        "--fault-malformed-sse-rate 1",
        "--fault-crash-after-requests 3",
    ]
    process = run_with_faults(tmp_path, schedule)
    text = (tmp_path / "autotune.out").read_text()
    assert process.returncode == 0, text
    outcomes = assert_consistent(tmp_path, 4)
    assert outcomes == ["ok", "errors", "no-requests", "engine-dead"], text


@pytest.mark.faults
@pytest.mark.timeout(300)
def test_every_server_fault_is_classified_and_nothing_is_lost(tmp_path: Path) -> None:
    """Startup hang, cut streams, stalled streams, a server that never answers,
    and GPU memory still held by a previous trial (retried once, then measured)."""
    schedule = [
        "",
        "--fault-hang-at-startup",
        "--fault-cut-stream-rate 1",
        "--fault-hang-stream-rate 1",
        "--fault-never-stream",
        "--fault-gpu-memory-held 20G",
        "",  # the retry after the held memory came back
    ]
    process = run_with_faults(tmp_path, schedule, "--trial-timeout", "15s")
    text = (tmp_path / "autotune.out").read_text()
    assert process.returncode == 0, text
    outcomes = assert_consistent(tmp_path, 6)
    expected = ["ok", "startup-timeout", "no-requests", "trial-timeout", "trial-timeout", "ok"]
    assert outcomes == expected, text
    retried = next((tmp_path / "runs").glob("*/trial-0005/server.log")).read_text()
    assert "retried: the first start failed because process 424242 held 20.00 GiB" in retried


@pytest.mark.faults
@pytest.mark.timeout(400)
def test_a_short_soak_loses_no_trial_and_leaves_no_process() -> None:
    argv = [sys.executable, str(REPO / "scripts" / "soak.py"), "--trials", "10", "--json"]
    argv += ["--fault-rate", "0.3"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=380, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(done.stdout)
    assert set(figures) == {"trials", "lost", "orphans", "rss_growth_mb", "fd_growth"}
    assert (figures["trials"], figures["lost"], figures["orphans"]) == (10, 0, 0)


def _kill_then_resume(tmp_path: Path, spawn, sig: int, when: str) -> None:
    """Start a 3-trial run, send ``sig`` when trial 1 is ``when``, then resume it."""
    path = tmp_path / "faults.txt"
    path.write_text("\n\n--fault-hang-at-startup\n" if when == "starting" else "\n")
    os.environ[FAULT_SCHEDULE_ENV] = str(path)  # spawn passes os.environ on
    try:
        args = run_args(tmp_path / "autotune.db", 3, "--heartbeat-interval", "1")
        process = spawn(*args, cwd=tmp_path)

        def reached() -> bool:
            log = tmp_path / "runs" / "faults" / "trial-0001" / "server.log"
            text = log.read_text() if log.exists() else ""
            marker = "Starting to load model" if when == "starting" else "Application startup"
            return marker in text

        assert wait_for(reached, timeout_s=150), output(tmp_path)
        os.kill(process.pid, sig)
        process.wait(timeout=60)
    finally:
        del os.environ[FAULT_SCHEDULE_ENV]
    assert wait_for(lambda: processes_in(tmp_path) == [], timeout_s=15), processes_in(tmp_path)
    rerun = subprocess.run(autotune_argv(*args), cwd=tmp_path, capture_output=True, timeout=200)
    assert rerun.returncode == 0, rerun.stdout.decode() + rerun.stderr.decode()
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    study = optuna.load_study(study_name="faults", storage=url)
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 3
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert [t.number for t in failed] == [1]  # the killed trial, recorded and retried
    loaded = load_study(url, "faults")  # kill -9 leaves no outcome: the heartbeat FAILs it
    assert all(row.outcome for row in loaded.trials if row.state == "COMPLETE")
    assert processes_in(tmp_path) == []


@pytest.mark.faults
@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("sig", "when"),
    [
        (signal.SIGKILL, "starting"),  # mid-startup: the server hangs while loading
        (signal.SIGTERM, "serving"),
        (signal.SIGINT, "starting"),
    ],
)
def test_killed_or_stopped_autotune_leaves_nothing_and_resumes(
    tmp_path: Path, spawn, sig: int, when: str
) -> None:
    _kill_then_resume(tmp_path, spawn, sig, when)


@pytest.mark.faults
@pytest.mark.timeout(400)
def test_kill_9_during_the_last_trial_then_an_immediate_rerun_makes_the_budget_exactly(
    tmp_path: Path, spawn
) -> None:
    """The rerun starts while the killed trial's heartbeat is still fresh (10 s, stale at
    30 s), with one trial of the budget left. It returned before the stale-trial check
    once it had run a new trial: the killed one stayed RUNNING for good."""
    args = run_args(tmp_path / "autotune.db", 2, "--heartbeat-interval", "10")
    process = spawn(*args, cwd=tmp_path)

    def last_trial_serving() -> bool:
        log = tmp_path / "runs" / "faults" / "trial-0001" / "server.log"
        return log.exists() and "Application startup complete" in log.read_text()

    assert wait_for(last_trial_serving, timeout_s=150), output(tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    killed = optuna.load_study(study_name="faults", storage=url).trials[1]
    assert killed.state == TrialState.RUNNING

    rerun = subprocess.run(autotune_argv(*args), cwd=tmp_path, capture_output=True, timeout=200)
    assert rerun.returncode == 0, rerun.stdout.decode() + rerun.stderr.decode()
    study = optuna.load_study(study_name="faults", storage=url)
    assert [t.state for t in study.trials] == [
        TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE
    ]  # fmt: skip
    assert b"waiting for it to end" in rerun.stdout, rerun.stdout.decode()
    retry = study.trials[2]
    assert TrialRecord.read(retry.user_attrs).retry_of == 1
    assert retry.params == killed.params
    assert processes_in(tmp_path) == []

    again = subprocess.run(autotune_argv(*args), cwd=tmp_path, capture_output=True, timeout=200)
    assert again.returncode == 0, again.stdout.decode() + again.stderr.decode()
    assert len(optuna.load_study(study_name="faults", storage=url).trials) == 3  # nothing more


@pytest.mark.faults
@pytest.mark.timeout(300)
def test_stale_trials_are_failed_first_whatever_the_count(tmp_path: Path) -> None:
    """A RUNNING trial killed before it named its worker has no heartbeat Optuna could
    find stale, and one left by an older autotune outlived a budget that was met: both
    stayed RUNNING for good. Heartbeat 1 s: stale after 3 s."""
    args = run_args(tmp_path / "autotune.db", 1, "--heartbeat-interval", "1")
    url = f"sqlite:///{tmp_path / 'autotune.db'}"

    def rerun(trials: int) -> optuna.Study:
        args[args.index("--trials") + 1] = str(trials)
        done = subprocess.run(autotune_argv(*args), cwd=tmp_path, capture_output=True, timeout=200)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        return optuna.load_study(study_name="faults", storage=url)

    study = rerun(1)
    study.ask()  # killed between Optuna's creating it and its first act: no worker, no heartbeat
    time.sleep(3.5)
    study = rerun(2)
    assert [t.state for t in study.trials] == [
        TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE
    ]  # fmt: skip

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(url, heartbeat_interval=1)
    left = study.ask()  # then a killed trial that had started: a heartbeat, then silence
    left.suggest_float("kv_cache_memory_gib", 8.0, 10.0, step=1.0)
    left.set_user_attr("worker", "elsewhere:1")
    storage.record_heartbeat(left._trial_id)
    time.sleep(3.5)
    study = rerun(2)  # the budget is met: the stale trial is failed, not retried
    assert [t.state for t in study.trials] == [
        TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE, TrialState.FAIL
    ]  # fmt: skip
    assert processes_in(tmp_path) == []


@pytest.mark.faults
@pytest.mark.timeout(400)
def test_a_short_soak_with_three_workers_on_postgres_loses_no_trial() -> None:
    argv = [sys.executable, str(REPO / "scripts" / "soak.py"), "--trials", "9", "--json"]
    argv += ["--fault-rate", "0.3", "--workers", "3"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=380, cwd=REPO)
    if "PostgresMissing" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(done.stdout)
    assert (figures["trials"], figures["lost"], figures["orphans"]) == (9, 0, 0)
