"""A long workload, as a user runs it: each trial's replay is capped and said so, the warm
start says what it does and stops at its budget, and Ctrl-C during it exits cleanly."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from autotune.config.space import default_space_path, load_space
from autotune.replay.load import LoadSpec
from autotune.study.setup import RunOptions, prepare_study
from autotune.study.trial_length import DEFAULT_REPLAY_BUDGET_S, size_replay
from autotune.workload import load_plan
from tests.e2e.conftest import (
    SAMPLE_WORKLOAD,
    SIM_MODEL,
    autotune_argv,
    output,
    tuner_args,
    wait_for,
)

HARDWARE = "rtx4080s-32g"


@pytest.fixture(scope="module")
def long_workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight agent sessions, two at a time: about half an hour of modelled replay."""
    path = tmp_path_factory.mktemp("long") / "long.jsonl"
    gen = ["workload", "gen", "claudecode", str(path), "--sessions", "8"]
    gen += ["--max-context", "32000", "--prefix-tokens", "4000"]
    subprocess.run(autotune_argv(*gen), check=True, capture_output=True, timeout=120)
    return path


def options(tmp_path: Path, workload: Path, load: LoadSpec) -> RunOptions:
    return RunOptions(
        workload=workload,
        model=SIM_MODEL,
        hardware=HARDWARE,
        storage=f"sqlite:///{tmp_path / 'autotune.db'}",
        load=load,
    )


def test_a_whole_workload_longer_than_a_trial_is_capped_with_one_line(
    tmp_path: Path, long_workload: Path
) -> None:
    """Before: no line, and every trial replayed the whole workload."""
    said: list[str] = []
    spec = prepare_study(options(tmp_path, long_workload, LoadSpec(concurrency=2)), say=said.append)
    assert spec.load.duration_s == DEFAULT_REPLAY_BUDGET_S
    assert spec.oracle is not None and spec.oracle.load == spec.load  # the tuner predicts it
    (line,) = [line for line in said if line.startswith("trial length")]
    assert "predicted on the simulator" in line and "set --duration to change it" in line
    # a budget the user gave is theirs, and a short workload replays whole
    given = LoadSpec(concurrency=2, max_requests=40)
    assert prepare_study(options(tmp_path, long_workload, given)).load == given
    short = prepare_study(options(tmp_path, SAMPLE_WORKLOAD, LoadSpec()), say=said.append)
    assert short.load.duration_s is None


def test_without_a_simulator_model_the_recorded_length_decides(long_workload: Path) -> None:
    plan = load_plan(long_workload)
    space = load_space(default_space_path(SIM_MODEL, None))
    slow = LoadSpec(concurrency=1, timing_scale=0.2)
    capped, line = size_replay(slow, plan, space=space, model=SIM_MODEL, engine_version=None,
                               oracle=None)  # fmt: skip
    assert capped.duration_s == DEFAULT_REPLAY_BUDGET_S and line and "(recorded)" in line
    fast = LoadSpec(concurrency=8, timing_scale=20)
    assert size_replay(fast, plan, space=space, model=SIM_MODEL, engine_version=None,
                       oracle=None) == (fast, None)  # fmt: skip


def run_args(tmp_path: Path, *extra: str, settings: dict | None = None) -> list[str]:
    fast = {"seed": 1, "confirm": 0, "simulator": {"time_scale": 200}, "load": {"max_requests": 8}}
    return [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim", "--hardware", HARDWARE,
        "--model", SIM_MODEL, "--storage", f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}",
        "--study", "night", "--concurrency", "4",
        *tuner_args(tmp_path / "settings", fast, settings or {}), *extra,
    ]  # fmt: skip


@pytest.mark.timeout(300)
def test_the_warm_start_says_what_it_does_and_stops_at_its_budget(tmp_path: Path, spawn) -> None:
    """Before: nothing between the pre-flight and the first trial, however long."""
    args = run_args(tmp_path, "--trials", "1", settings={"warm_start_budget_s": 1})
    process = spawn(*args, cwd=tmp_path)
    assert process.wait(timeout=280) == 0, output(tmp_path)
    logged = (tmp_path / "studies" / "runs" / "night" / "run.log").read_text()
    assert "Warm start: screening " in logged and "the replay judging the best" in logged, logged
    assert "stopped by the 1-s safety stop" in logged, logged
    assert logged.index("Warm start: screening") < logged.index("trial 0 (baseline)")
    assert "trial None" not in logged


@pytest.mark.timeout(300)
def test_ctrl_c_during_the_warm_start_exits_cleanly(tmp_path: Path, spawn) -> None:
    """Before: "the running trial is recorded as interrupted", then "holds no study yet"."""
    process = spawn(*run_args(tmp_path, "--trials", "2"), cwd=tmp_path)
    assert wait_for(lambda: "Warm start: screening" in output(tmp_path), timeout_s=240)
    assert process.poll() is None, output(tmp_path)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130, output(tmp_path)
    text = output(tmp_path)
    assert "Interrupted before the first trial" in text, text
    for wrong in ("Traceback", "holds no study", "recorded as interrupted", "trial 0"):
        assert wrong not in text, text
