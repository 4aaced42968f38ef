"""Pruning end to end: the real CLI, real simulator processes, the replay's progress over HTTP.

The grid with seed 1 walks max-num-seqs 16 (the baseline), 1, then 12 under eight
requests at once: one at a time is hopeless (about a third of sixteen's
throughput) and is stopped early; twelve is within noise of sixteen and runs out.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.trial.record import TrialRecord
from tests.e2e.conftest import (
    REPO,
    SAMPLE_WORKLOAD,
    autotune_argv,
    autotune_in_process,
    output,
    processes_in,
    sim_server_pids,
    tuner_args,
    wait_for,
)

PRUNE_SPACE = REPO / "tests" / "e2e" / "data" / "prune.yaml"
REQUESTS = 40


def run_args(db: Path, *extra: str, prune: bool) -> list[str]:
    settings = {
        "seed": 1,
        "warm_start": 0,
        "confirm": 0,
        "prune": prune,
        "simulator": {"time_scale": 50},
        "load": {"max_requests": REQUESTS},
    }
    return [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(PRUNE_SPACE),
        "--storage", f"sqlite:///{db}", "--study", "prune", "--sampler", "grid",
        "--mode", "concurrency", "--concurrency", "8",
        *tuner_args(db.parent.parent / "settings", settings), *extra,
    ]  # fmt: skip


def trials_by_seqs(db: Path) -> dict[int, FrozenTrial]:
    study = optuna.load_study(study_name="prune", storage=f"sqlite:///{db}")
    return {trial.params["max_num_seqs"]: trial for trial in study.trials}


@pytest.fixture(scope="module")
def pruned_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[int]]:
    """Three trials with pruning on; the sim servers seen while trial 2 ran."""
    cwd = tmp_path_factory.mktemp("prune")
    db = cwd / "studies" / "autotune.db"
    with (cwd / "autotune.out").open("w") as out:
        process = subprocess.Popen(
            autotune_argv(*run_args(db, "--trials", "3", prune=True)),
            cwd=cwd,
            stdout=out,
            stderr=out,
        )
    try:
        assert wait_for(lambda: "trial 2: replaying" in output(cwd), timeout_s=200), output(cwd)
        servers_during_trial_2 = sim_server_pids(process.pid)
        assert process.wait(timeout=200) == 0, output(cwd)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert wait_for(lambda: not processes_in(cwd), timeout_s=10), "a server outlived autotune"
    return db, output(cwd), servers_during_trial_2


@pytest.mark.timeout(300)
def test_a_hopeless_config_is_pruned_its_replay_stopped_and_its_server_gone(
    pruned_run: tuple[Path, str, list[int]],
) -> None:
    """Before: no pruning; one request at a time ran all 40 requests."""
    db, text, servers_during_trial_2 = pruned_run
    trials = trials_by_seqs(db)
    bad, best = trials[1], trials[16]
    assert bad.state == TrialState.PRUNED
    assert TrialRecord.read(bad.user_attrs).outcome == "pruned"
    assert not TrialRecord.read(bad.user_attrs).measured
    replay = TrialRecord.read(bad.user_attrs).replay
    assert replay is not None and replay.stopped_early is not None
    assert replay.stopped_early.startswith("pruned at ")
    assert replay.completed < REQUESTS / 2
    step = max(bad.intermediate_values)
    assert 20 <= step < 50
    assert bad.intermediate_values[step] < 0.8 * best.values[0]
    # The pruned trial's server was stopped before the next one launched.
    assert len(servers_during_trial_2) == 1, servers_during_trial_2
    assert re.search(r"trial 1 \[2/3\] pruned: pruned at \d+% of the replay: [\d.]+ output", text)
    shown = autotune_in_process(
        "show", "--storage", f"sqlite:///{db}", "--study", "prune", columns=200
    )
    assert re.search(r"│ 1 │ pruned\s+│\s+\([\d.]+ so far\)", shown.stdout), shown.stdout


@pytest.mark.timeout(300)
def test_a_config_close_to_the_best_is_not_pruned(
    pruned_run: tuple[Path, str, list[int]],
) -> None:
    db, text, _ = pruned_run
    trials = trials_by_seqs(db)
    close = trials[12]
    assert close.state == TrialState.COMPLETE
    stored = TrialRecord.read(close.user_attrs)
    assert stored.outcome == "ok" and stored.replay is not None
    assert stored.replay.stopped_early is None and stored.replay.completed == REQUESTS
    assert max(close.intermediate_values) == 95  # every step was reported and judged
    assert "Best: trial 0" in text or "Best: trial 2" in text


@pytest.mark.timeout(300)
def test_no_prune_runs_the_hopeless_config_to_the_end(tmp_path: Path) -> None:
    db = tmp_path / "studies" / "autotune.db"
    result = subprocess.run(
        autotune_argv(*run_args(db, "--trials", "2", prune=False)),
        cwd=tmp_path, capture_output=True, text=True, timeout=250,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    bad = trials_by_seqs(db)[1]
    assert bad.state == TrialState.COMPLETE
    stored = TrialRecord.read(bad.user_attrs)
    assert stored.outcome == "ok" and stored.replay is not None
    assert stored.replay.completed == REQUESTS
    assert bad.intermediate_values == {}
