"""The study loop end to end: the real CLI, real simulator processes, a real SQLite study."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.trial.record import TrialRecord
from tests.conftest import scaled_timeout_s
from tests.e2e.conftest import (
    REPO,
    SAMPLE_WORKLOAD,
    alive,
    autotune_argv,
    autotune_in_process,
    output,
    processes_in,
    sim_server_pids,
    trial_logs,
    tuner_args,
    wait_for,
)

OOM_SPACE = REPO / "tests" / "e2e" / "data" / "oom-boundary.yaml"
FITS_SPACE = REPO / "tests" / "e2e" / "data" / "fits.yaml"
FAST = {"load": {"max_requests": 10}, "confirm": 0, "seed": 1}


def run_args(
    db: Path,
    *extra: str,
    study: str = "e2e",
    space: Path = OOM_SPACE,
    time_scale: int = 200,
    settings: dict | None = None,
) -> list[str]:
    """Time scale 200 where memory, outcomes and processes are asserted; 50 for SLOs and
    for interrupting a given trial."""
    return [
        "run",
        "--workload", str(SAMPLE_WORKLOAD),
        "--engine", "sim",
        "--hardware", "rtx4080s-32g",
        "--model", "qwen3.6-27b-awq",
        "--space", str(space),
        "--storage", f"sqlite:///{db}",
        "--study", study,
        "--sampler", "grid",
        "--concurrency", "4",
        *tuner_args(db.parent, FAST, {"simulator": {"time_scale": time_scale}}, settings or {}),
        *extra,
    ]  # fmt: skip


def load(db: Path, name: str = "e2e") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{db}")


def record(trial: FrozenTrial) -> TrialRecord:
    """What the trial stored, read as the results commands read it."""
    return TrialRecord.read(trial.user_attrs)


@pytest.mark.timeout(240)
def test_a_study_launches_replays_scores_and_learns_where_oom_lives(tmp_path: Path) -> None:
    db = tmp_path / "studies" / "autotune.db"
    result = subprocess.run(
        autotune_argv(*run_args(db, "--trials", "4", settings={"prescreen": False})),
        cwd=tmp_path, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Best: trial" in result.stdout

    study = load(db)
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) == 4
    by_kv = {t.params["kv_cache_memory_gib"]: t for t in trials}
    assert set(by_kv) == {8.0, 10.0, 12.0, 14.0}
    assert [t.params["kv_cache_memory_gib"] for t in trials if record(t).is_baseline] == [8.0]
    # Every trial carries the same constraint keys (GPSampler refuses anything else).
    assert {frozenset(t.constraints) for t in trials} == {frozenset({"oom", "crash", "error_rate"})}
    # OOM lives above a ceiling: every pool below it runs, every pool above it dies.
    ok = sorted(kv for kv, t in by_kv.items() if record(t).outcome == "ok")
    oom = sorted(kv for kv, t in by_kv.items() if t.constraints["oom"] > 0)
    assert ok and oom and max(ok) < min(oom) and len(ok) + len(oom) == 4
    for kv in ok:
        trial, stored = by_kv[kv], record(by_kv[kv])
        assert trial.value > 0
        assert trial.constraints["oom"] < 0
        assert stored.startup is not None and stored.startup.kv_cache_tokens > 0
        assert stored.replay is not None and stored.replay.completed >= 10
        assert stored.server_stats is not None and stored.server_stats.generation_tokens > 0
        assert stored.argv is not None and "--kv-cache-memory-bytes" in stored.argv
    for kv in oom:
        stored = record(by_kv[kv])
        assert stored.outcome in ("kv-does-not-fit", "cuda-oom-startup", "cuda-oom-load")
        assert stored.failure is not None and stored.failure.log_excerpt
        assert stored.memory is not None
        assert stored.memory["fits"] is False or stored.outcome == "cuda-oom-load"
    if len(ok) > 1:  # a bigger pool holds more tokens
        tokens = [record(by_kv[kv]).startup.kv_cache_tokens for kv in ok]  # type: ignore[union-attr]
        assert tokens == sorted(tokens) and tokens[0] < tokens[-1]
    assert study.best_trial.params["kv_cache_memory_gib"] in ok

    # Server logs and request records are kept as artifacts beside the database.
    artifacts = list((db.parent / "artifacts").rglob("*"))
    assert sum(1 for path in artifacts if path.is_file()) >= 4

    storage = f"sqlite:///{db}"
    shown = autotune_in_process("show", "--storage", storage, "--study", "e2e", columns=250)
    assert shown.returncode == 0, shown.stderr
    for outcome in ("ok", str(record(by_kv[14.0]).outcome), "baseline"):
        assert outcome in shown.stdout
    listed = autotune_in_process("studies", "--storage", storage, columns=250)
    assert "e2e" in listed.stdout and "4" in listed.stdout
    assert processes_in(tmp_path) == []  # no server outlived autotune


@pytest.mark.timeout(120)
def test_the_memory_prescreen_scores_certain_ooms_without_launching(tmp_path: Path) -> None:
    db = tmp_path / "autotune.db"
    result = subprocess.run(
        autotune_argv(*run_args(db, "--trials", "4")),
        cwd=tmp_path, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    trials = load(db).trials
    rejected = [t for t in trials if record(t).outcome == "predicted-oom"]
    launched = [t for t in trials if record(t).outcome != "predicted-oom"]
    assert rejected and launched
    for trial in rejected:
        stored = record(trial)
        assert stored.argv is None  # never launched
        assert trial.constraints["oom"] > 0
        assert stored.memory is not None and stored.memory["load_transient_bytes"] > 0
    # The memory model rejects exactly the pools the server could not run.
    assert max(t.params["kv_cache_memory_gib"] for t in launched) < min(
        t.params["kv_cache_memory_gib"] for t in rejected
    )
    assert all(record(t).outcome == "ok" for t in launched)


@pytest.mark.timeout(200)
def test_kill_9_leaves_no_server_and_the_rerun_recovers_the_trial(tmp_path: Path, spawn) -> None:
    db = tmp_path / "autotune.db"
    args = run_args(db, "--trials", "3", "--heartbeat-interval", "1", space=FITS_SPACE)
    args[args.index("--sampler") + 1] = "random"
    process = spawn(*args, cwd=tmp_path)

    def later_trial_serving() -> bool:
        started = trial_logs(tmp_path / "runs")
        return any(n >= 1 for n in started) and bool(sim_server_pids(process.pid))

    # Wait until a trial after the baseline has its server up, then kill autotune outright.
    assert wait_for(later_trial_serving, timeout_s=150), output(tmp_path)
    killed = max(trial_logs(tmp_path / "runs"))
    servers = sim_server_pids(process.pid)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    assert wait_for(lambda: not any(alive(pid) for pid in servers), timeout_s=15), servers

    rerun = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=150
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    study = load(db)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert len(complete) == 3
    assert [t.number for t in failed] == [killed]
    retried = [t for t in complete if t.system_attrs.get("failed_trial") == killed]
    assert len(retried) == 1
    assert retried[0].params == failed[0].params
    assert record(retried[0]).retry_of == killed  # as after Ctrl-C (docs/architecture.md)


@pytest.mark.timeout(200)
def test_ctrl_c_records_the_trial_as_interrupted_and_stops_its_server(
    tmp_path: Path, spawn
) -> None:
    db = tmp_path / "autotune.db"
    # Scale 50: trial 0 serves long enough for the poll below to interrupt it, not trial 1.
    args = run_args(db, "--trials", "2", space=FITS_SPACE, time_scale=50)
    args[args.index("--sampler") + 1] = "random"
    process = spawn(*args, cwd=tmp_path)
    assert wait_for(
        lambda: 0 in trial_logs(tmp_path / "runs") and bool(sim_server_pids(process.pid)),
        timeout_s=150,
    ), output(tmp_path)
    servers = sim_server_pids(process.pid)
    os.kill(process.pid, signal.SIGINT)
    process.wait(timeout=scaled_timeout_s(60))
    assert process.returncode == 130, output(tmp_path)
    assert "Interrupted" in output(tmp_path)
    assert not any(alive(pid) for pid in servers)
    assert processes_in(tmp_path) == []
    interrupted = load(db).trials[0]
    assert interrupted.state == TrialState.FAIL
    assert record(interrupted).outcome == "interrupted"

    rerun = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=150
    )
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    study = load(db)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 2
    assert any(record(t).retry_of == 0 for t in complete)


@pytest.mark.timeout(150)
def test_a_pareto_study_with_slos_stores_two_values_and_slo_margins(tmp_path: Path) -> None:
    db = tmp_path / "autotune.db"
    args = run_args(
        db,
        "--trials",
        "3",
        "--objective",
        "throughput,latency",
        "--slo",
        "ttft_p95<=60s",
        "--slo",
        "tpot_p50<=1s",
        study="pareto",
        time_scale=50,
    )
    args[args.index("--sampler") + 1] = "tpe"
    result = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=140
    )
    assert result.returncode == 0, result.stdout + result.stderr
    study = load(db, "pareto")
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert study.metric_names == ["output_tok_s", "e2e_p95_s"]
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 3
    keys = {"oom", "crash", "error_rate", "slo:ttft_p95", "slo:tpot_p50"}
    assert all(set(t.constraints) == keys for t in complete)
    measured = [t for t in complete if record(t).outcome == "ok"]
    assert measured
    for trial in measured:
        replay = record(trial).replay
        assert replay is not None
        assert trial.values == [
            pytest.approx(replay.output_throughput_tok_s),
            pytest.approx(replay.e2e.p95),
        ]
        assert trial.constraints["slo:ttft_p95"] == pytest.approx(replay.ttft.p95 / 60 - 1)
    assert study.best_trials  # a feasible Pareto front exists
