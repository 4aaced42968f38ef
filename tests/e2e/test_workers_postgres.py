"""Several workers in one study on a real PostgreSQL server: `run --gpus`, `autotune worker`.

The real CLI, real simulator processes, a real server started by the fixture
(tests/e2e/postgres.py); every check reads the study back through Optuna's API.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.sim.server.faults import FAULT_SCHEDULE_ENV
from autotune.study import storage_url
from tests.e2e.conftest import (
    SAMPLE_WORKLOAD,
    alive,
    autotune_argv,
    output,
    processes_in,
    sim_server_pids,
    tuner_args,
    wait_for,
)
from tests.e2e.test_study_sim import FITS_SPACE, OOM_SPACE

pytestmark = pytest.mark.postgres

FAST = {"seed": 1, "simulator": {"time_scale": 50}, "load": {"max_requests": 8}}
RANDOM = {"dedup": False, "warm_start": 0, "confirm": 0}  # with --sampler random


def run_args(
    url: str, cwd: Path, *extra: str, space: Path = OOM_SPACE, settings: dict | None = None
) -> list[str]:
    return [
        "run",
        "--workload", str(SAMPLE_WORKLOAD),
        "--engine", "sim",
        "--hardware", "rtx4080s-32g",
        "--model", "qwen3.6-27b-awq",
        "--space", str(space),
        "--storage", url,
        "--study", "multi",
        "--heartbeat-interval", "1",
        "--concurrency", "4",
        *tuner_args(cwd / "settings", FAST, settings or {}),
        *extra,
    ]  # fmt: skip


def load(url: str) -> optuna.Study:
    storage = url.replace("postgresql://", "postgresql+psycopg://")
    return optuna.load_study(study_name="multi", storage=storage)


def _overlap(a: FrozenTrial, b: FrozenTrial) -> bool:
    return a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete


@pytest.mark.timeout(300)
def test_three_workers_run_every_trial_once_and_never_one_config_twice_at_once(
    tmp_path: Path, postgres_url: str
) -> None:
    # Re-measurements in the tail alone: with explore_tail on, the tail may rightly explore
    # a config the guide expects to beat the leader (no trial confirms); with race_early on,
    # a trial before the tail may re-measure (a third confirms).
    args = run_args(
        postgres_url, tmp_path, "--gpus", "0,1,2", "--trials", "9",
        settings={"confirm": 2, "explore_tail": False, "race_early": False},
    )  # fmt: skip
    result = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 workers, GPU groups 0 | 1 | 2" in result.stdout
    study = load(postgres_url)
    trials = study.get_trials()
    assert [t.number for t in trials] == list(range(len(trials)))
    assert {t.state for t in trials} == {TrialState.COMPLETE}, [t.state for t in trials]
    # The budget (re-measurements included) counts over every worker, not per worker:
    # exactly 9, never one more per worker that asked just before another's finished.
    assert len(trials) == 9
    search = [t for t in trials if "confirms" not in t.user_attrs]
    groups = {t.user_attrs["worker"].split(" gpus ")[1] for t in trials}
    assert groups <= {"0", "1", "2"}  # not each: one worker can launch all there is (below)
    launched = [t for t in search if t.user_attrs.get("argv")]
    for index, first in enumerate(launched):
        for second in launched[index + 1 :]:
            if _overlap(first, second):  # side by side: own ports, never the same config
                assert first.user_attrs["argv"] != second.user_attrs["argv"]
                port = first.user_attrs["argv"].index("--port") + 1
                assert first.user_attrs["argv"][port] != second.user_attrs["argv"][port]
    # Of this space's 4 configs, the guided sampler launches the baseline alone: two are
    # predicted to OOM, one to behave like the baseline. No trial answered without a launch
    # (a duplicate, a predicted OOM) starts while a launch runs: the other workers wait.
    # Before: they answered trials while the launch ran and could spend the budget so that
    # the tail had nothing measured to re-measure (seen 1 run in 8).
    answered = [t for t in trials if not t.user_attrs.get("argv")]
    assert answered
    for instant in answered:
        for launch in (t for t in trials if t.user_attrs.get("argv")):
            during = launch.datetime_start < instant.datetime_start < launch.datetime_complete
            assert not during, (instant.number, launch.number)
    assert "nothing left that the guided sampler proposes" in result.stdout
    # Re-measurements stay in the budget's tail (2 slots), and there is one at least.
    confirming = [t for t in trials if "confirms" in t.user_attrs]
    assert 1 <= len(confirming) <= 2
    assert "winner" in study.user_attrs
    assert not processes_in(tmp_path)


@pytest.mark.timeout(300)
def test_kill_9_of_one_worker_leaves_no_server_and_another_worker_retries_its_trial(
    tmp_path: Path, postgres_url: str, spawn
) -> None:
    args = run_args(postgres_url, tmp_path, "--gpus", "0,1,2", "--trials", "8", space=FITS_SPACE,
                    settings=RANDOM)  # fmt: skip
    args += ["--sampler", "random"]
    process = spawn(*args, cwd=tmp_path)

    def serving_worker() -> int | None:
        for pid in _children(process.pid):
            if sim_server_pids(pid):
                return pid
        return None

    assert wait_for(lambda: serving_worker() is not None, timeout_s=150), output(tmp_path)
    victim = serving_worker()
    assert victim is not None
    servers = sim_server_pids(victim)
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: not any(alive(pid) for pid in servers), timeout_s=15), servers
    assert process.wait(timeout=240) == 0, output(tmp_path)

    study = load(postgres_url)
    trials = study.get_trials()
    killed = [t for t in trials if t.user_attrs.get("worker", "").split(" ")[0].endswith(
        f":{victim}") and t.state != TrialState.COMPLETE]  # fmt: skip
    assert [t.state for t in killed] == [TrialState.FAIL]
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == killed[0].number]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert retried[0].params == killed[0].params
    assert f":{victim}" not in retried[0].user_attrs["worker"]
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 8
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    assert "exited with -9" in output(tmp_path)
    assert not processes_in(tmp_path)


@pytest.mark.timeout(200)
def test_a_worker_on_other_hardware_is_refused_unless_allowed(
    tmp_path: Path, postgres_url: str
) -> None:
    args = run_args(
        postgres_url, tmp_path, "--trials", "1", settings={"warm_start": 0, "confirm": 0}
    )
    created = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=150
    )
    assert created.returncode == 0, created.stdout + created.stderr
    study = load(postgres_url)
    study.set_user_attr("hardware", {**study.user_attrs["hardware"], "gpu_name": "NVIDIA H200"})
    before = len(study.trials)
    join = ["worker", "--storage", postgres_url, "--study", "multi"]
    refused = subprocess.run(
        autotune_argv(*join), cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "--allow-other-hardware" in refused.stderr and "NVIDIA H200" in refused.stderr
    assert len(load(postgres_url).trials) == before

    study.set_user_attr("run_options", {**study.user_attrs["run_options"], "trials": 2})
    allowed = subprocess.run(
        autotune_argv(*join, "--allow-other-hardware"),
        cwd=tmp_path, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert len(load(postgres_url).get_trials(states=(TrialState.COMPLETE,))) == 2


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return found


@pytest.mark.timeout(240)
def test_kill_9_of_run_gpus_takes_its_workers_and_their_servers_with_it(
    tmp_path: Path, postgres_url: str, spawn
) -> None:
    args = run_args(postgres_url, tmp_path, "--gpus", "0,1", "--trials", "8", space=FITS_SPACE,
                    settings=RANDOM)  # fmt: skip
    args += ["--sampler", "random"]
    process = spawn(*args, cwd=tmp_path)

    def serving() -> bool:
        return any(sim_server_pids(pid) for pid in _children(process.pid))

    assert wait_for(serving, timeout_s=150), output(tmp_path)
    workers = _children(process.pid)
    servers = [pid for worker in workers for pid in sim_server_pids(worker)]
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    gone = [*workers, *servers]
    assert wait_for(lambda: not any(alive(pid) for pid in gone), timeout_s=60), gone
    # A server a worker spawned after the listing above dies with its worker, a moment later.
    assert wait_for(lambda: not processes_in(tmp_path), timeout_s=30), processes_in(tmp_path)
    running = load(postgres_url).get_trials(states=(TrialState.RUNNING,))
    assert not running  # each worker recorded its trial as interrupted on the way out


def _pid_of(worker: str) -> int:
    """``host:pid gpus G`` -> pid."""
    return int(worker.split(" ")[0].rsplit(":", 1)[1])


@pytest.mark.timeout(400)
def test_a_worker_killed_during_the_last_trial_leaves_exactly_the_budget(
    tmp_path: Path, postgres_url: str, spawn
) -> None:
    """The run exited 0 with 5 COMPLETE + 1 RUNNING of 6 (the others stopped, counting
    the dead worker's trial as under way), the next rerun ran nothing, the one after 7."""
    schedule = tmp_path / "faults.txt"  # the last launch serves slowly: time to kill it
    schedule.write_text("\n" * 5 + "--fault-slow-first-token-s 300\n")
    os.environ[FAULT_SCHEDULE_ENV] = str(schedule)
    try:
        args = run_args(
            postgres_url, tmp_path, "--gpus", "0,1,2", "--trials", "6", "--sampler", "random",
            space=FITS_SPACE, settings=RANDOM,
        )  # fmt: skip
        process = spawn(*args, cwd=tmp_path)

        storage = optuna.storages.RDBStorage(storage_url(postgres_url))  # one pool for the polls

        def last_trial_serving() -> int | None:
            try:
                study = optuna.load_study(study_name="multi", storage=storage)
            except KeyError:  # not created yet
                return None
            counted = len(study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED)))
            running = study.get_trials(states=(TrialState.RUNNING,))
            if counted != 5 or len(running) != 1 or "worker" not in running[0].user_attrs:
                return None
            worker = _pid_of(running[0].user_attrs["worker"])
            return worker if sim_server_pids(worker) else None

        assert wait_for(lambda: last_trial_serving() is not None, timeout_s=200), output(tmp_path)
        victim = last_trial_serving()
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        assert process.wait(timeout=240) == 0, output(tmp_path)
    finally:
        del os.environ[FAULT_SCHEDULE_ENV]

    def budget_exact(study: optuna.Study) -> list[FrozenTrial]:
        counted = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
        assert len(counted) == 6, [t.state for t in study.trials]
        assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
        return study.get_trials(states=(TrialState.FAIL,))

    failed = budget_exact(load(postgres_url))
    assert [_pid_of(t.user_attrs["worker"]) for t in failed] == [victim]
    retry = [t for t in load(postgres_url).trials if t.user_attrs.get("retry_of") is not None]
    assert [t.user_attrs["retry_of"] for t in retry] == [failed[0].number]
    assert retry[0].state == TrialState.COMPLETE and retry[0].params == failed[0].params
    assert wait_for(lambda: not processes_in(tmp_path), timeout_s=15), processes_in(tmp_path)
    for _ in range(2):  # reruns find the budget met: they run nothing
        rerun = subprocess.run(
            autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=150
        )
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        budget_exact(load(postgres_url))
        assert len(load(postgres_url).trials) == 7


@pytest.mark.timeout(300)
def test_workers_of_a_seeded_random_study_draw_their_own_configs(
    tmp_path: Path, postgres_url: str
) -> None:
    """`--sampler random --seed 1` with three workers: each drew the same stream and
    proposed the same config as the others, in lockstep."""
    space = tmp_path / "continuous.yaml"  # no step: two draws of one value are lockstep
    space.write_text(FITS_SPACE.read_text().replace("    step: 1.0\n", ""))
    args = run_args(
        postgres_url, tmp_path, "--gpus", "0,1,2", "--trials", "7", "--sampler", "random",
        space=space, settings=RANDOM,
    )  # fmt: skip
    done = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stdout + done.stderr
    drawn: dict[str, list[float]] = {}
    for trial in load(postgres_url).get_trials(states=(TrialState.COMPLETE,)):
        if not trial.user_attrs.get("is_baseline"):
            group = trial.user_attrs["worker"].split(" gpus ")[1]
            drawn.setdefault(group, []).append(trial.params["kv_cache_memory_gib"])
    assert len(drawn) >= 2, drawn
    firsts = [values[0] for values in drawn.values()]
    assert len(set(firsts)) == len(firsts), drawn
