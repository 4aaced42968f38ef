"""A server that hangs (SIGSTOP) never stalls autotune: `autotune replay` ends with one
line, a study's trial ends as `trial-timeout` within its default limit and the study
goes on, and the limit is said in the run's first lines and kept for a resume."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune.replay.load import LoadSpec
from autotune.results.reader import load_study
from autotune.sim.server.faults import FAULT_SCHEDULE_ENV
from autotune.study.setup import RunOptions, prepare_study
from autotune.study.trial_length import MIN_REPLAY_LIMIT_S, REPLAY_LIMIT_FACTOR
from tests.e2e.conftest import (
    REPO,
    SAMPLE_WORKLOAD,
    SIM_ARGS,
    alive,
    autotune_argv,
    output,
    processes_in,
    sim_server_pids,
    tuner_args,
    wait_for,
)
from tests.replay.conftest import free_port, wait_ready

FITS_SPACE = REPO / "tests" / "e2e" / "data" / "fits.yaml"
LIMIT_LINE = re.compile(r"Trial time limit: (?P<limit>\d+)(?P<unit>[sm]) once the server is ready")


def start_sim(log: Path, *faults: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A simulator process in its own session (so SIGSTOP stops all of it)."""
    port = free_port()
    argv = [sys.executable, "-m", "autotune.sim", "serve", *SIM_ARGS, *faults]
    argv += ["--port", str(port), "--time-scale", "50"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, process, timeout_s=60)
    return url, process


@pytest.fixture
def stopped_sim(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A healthy simulator the test may SIGSTOP; continued and ended afterwards."""
    url, process = start_sim(tmp_path / "sim.log", "--fault-slow-first-token-s", "100")
    try:
        yield url, process
    finally:
        os.killpg(process.pid, signal.SIGCONT)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def replay_argv(url: str, *extra: str) -> list[str]:
    """`autotune replay` of the sample workload (55 requests, each 2 s to its first token
    here, so a whole replay lasts about half a minute)."""
    return autotune_argv(
        "replay", "--url", url, "--workload", str(SAMPLE_WORKLOAD), "--server-time-scale",
        "50", "--concurrency", "4", *extra,
    )  # fmt: skip


@pytest.mark.timeout(150)
def test_autotune_replay_against_a_stopped_server_ends_with_one_line(
    stopped_sim: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """Before: the model-name fetch (and with --model the template probes) had no
    timeout, and `autotune replay` waited for ever."""
    url, process = stopped_sim
    os.killpg(process.pid, signal.SIGSTOP)
    started = time.monotonic()
    runs = [  # both at once: the fetch of the model name, and the probe when it is given
        subprocess.Popen(replay_argv(url, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for extra in ((), ("--model", "qwen3.6-27b-awq"))
    ]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 2, (out, err)
        lines = err.decode().strip().splitlines()
        assert len(lines) == 1, err.decode()
        assert "did not answer GET /v1/models within 30 s" in lines[0], lines[0]
        assert "stopped (SIGSTOP) or hung" in lines[0] and url in lines[0], lines[0]
    assert time.monotonic() - started < 100


@pytest.mark.faults
@pytest.mark.timeout(240)
def test_autotune_replay_gives_up_on_a_server_stopped_mid_replay(
    stopped_sim: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """Before: the requests in flight ran into their 10-minute timeout one after another,
    and the final /metrics scrape waited for ever. Then: when every request in flight
    failed before the minute of silence was up, the replay ended with exit 0."""
    url, process = stopped_sim
    run = subprocess.Popen(replay_argv(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(8)  # the probes done, requests in flight (each waits 2 s for its first token)
    assert run.poll() is None
    os.killpg(process.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    out, err = run.communicate(timeout=200)
    waited_s = time.monotonic() - stopped
    assert run.returncode == 2, (out, err)
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "stopped answering" in lines[0], err.decode()
    assert waited_s < 110, waited_s  # the 60-s limit (or the replay's end), a scrape's 10 s


@pytest.mark.timeout(240)
def test_the_default_limit_is_said_first_sized_from_the_prediction_and_kept_on_resume(
    tmp_path: Path,
) -> None:
    """Before: no limit at all without --trial-timeout, and nothing said."""
    storage = f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    first = subprocess.run(
        autotune_argv(
            "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
            "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(FITS_SPACE),
            "--storage", storage, "--study", "limits", "--sampler", "grid", "--concurrency", "4",
            "--trials", "1",
            *tuner_args(tmp_path / "settings", {"confirm": 0, "load": {"max_requests": 8},
                                                "simulator": {"time_scale": 200}}),
        ),
        cwd=tmp_path, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    assert _limit_s(first.stdout) == MIN_REPLAY_LIMIT_S  # 8 requests 200x faster: the floor
    assert first.stdout.index("Trial time limit") < first.stdout.index("trial 0"), first.stdout

    def options(study: str, **extra: object) -> RunOptions:
        return RunOptions(  # the whole workload at real speed: a longer limit, were it sized
            workload=SAMPLE_WORKLOAD, model="qwen3.6-27b-awq", hardware="rtx4080s-32g",
            space=FITS_SPACE, storage=storage, study=study, time_scale=1.0, load=LoadSpec(),
            **extra,
        )  # fmt: skip

    said: list[str] = []
    fresh = prepare_study(options("another"), say=said.append)
    (line,) = [line for line in said if line.startswith("Trial time limit")]
    assert fresh.replay_timeout_s is not None and fresh.trial_timeout_s is None
    predicted_s = fresh.replay_timeout_s / REPLAY_LIMIT_FACTOR  # about 4 modelled minutes
    assert 60 < predicted_s < 1200 and f"{REPLAY_LIMIT_FACTOR}x the predicted" in line, line
    said.clear()
    resumed = prepare_study(options("limits"), say=said.append)
    assert resumed.replay_timeout_s == MIN_REPLAY_LIMIT_S, said
    stored_line = "as the study stored it; --trial-timeout to change)."
    assert any(line.endswith(stored_line) for line in said), said
    given = prepare_study(options("limits", trial_timeout_s=45.0), say=said.append)
    assert (given.trial_timeout_s, given.replay_timeout_s) == (45.0, None)
    assert said[-1] == "Trial time limit: 45s, start included (--trial-timeout)."
    stored = optuna.load_study(study_name="limits", storage=storage).user_attrs["run_options"]
    joined = RunOptions.model_validate(stored | {"storage": storage, "study": "limits"})
    assert prepare_study(joined).replay_timeout_s == MIN_REPLAY_LIMIT_S  # `autotune worker`


def _limit_s(text: str) -> float:
    match = LIMIT_LINE.search(text)
    assert match, text
    return float(match["limit"]) * (60 if match["unit"] == "m" else 1)


@pytest.mark.faults
@pytest.mark.timeout(480)
def test_a_server_hung_mid_trial_is_a_trial_timeout_and_the_study_goes_on(
    tmp_path: Path, spawn
) -> None:
    """SIGSTOP the second trial's server while it serves, with no --trial-timeout.

    Before: the trial never ended (the client waited for ever on the stopped server).
    """
    schedule = tmp_path / "faults.txt"  # trial 1's requests start slowly: stopped mid-replay
    schedule.write_text("\n--fault-slow-first-token-s 60\n\n")
    os.environ[FAULT_SCHEDULE_ENV] = str(schedule)  # spawn passes os.environ on
    try:
        process = spawn(
            "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
            "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq",
            "--space", str(FITS_SPACE), "--storage", f"sqlite:///{tmp_path / 'autotune.db'}",
            "--study", "hangs", "--sampler", "random", "--concurrency", "4", "--trials", "3",
            *tuner_args(tmp_path / "settings", {"dedup": False, "warm_start": 0, "confirm": 0,
                                                "seed": 1, "simulator": {"time_scale": 20},
                                                "engine": {"startup_timeout_s": 60.0}}),
            cwd=tmp_path,
        )  # fmt: skip
        log = tmp_path / "runs" / "hangs" / "trial-0001" / "server.log"
        ready = wait_for(
            lambda: log.exists() and "Application startup complete" in log.read_text(),
            timeout_s=180,
        )
        assert ready, output(tmp_path)
        time.sleep(2)  # replaying now: each request waits 3 s for its first token
        (server,) = sim_server_pids(parent=process.pid)
        os.killpg(server, signal.SIGSTOP)
        stopped = time.monotonic()
        assert process.wait(timeout=400) == 0, output(tmp_path)
    finally:
        del os.environ[FAULT_SCHEDULE_ENV]
    text = output(tmp_path)
    limit_s = _limit_s(text)
    assert text.index("Trial time limit") < text.index("trial 0 (baseline)"), text
    assert not alive(server)  # its group was killed, and the run went on without it
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    loaded = load_study(url, "hangs")
    assert [row.outcome for row in loaded.trials] == ["ok", "trial-timeout", "ok"], text
    hung = loaded.trials[1]
    ready_s = hung.startup.ready_s if hung.startup else 0.0
    assert limit_s <= hung.wall_s <= ready_s + limit_s + 20, (hung.wall_s, limit_s)
    assert time.monotonic() - stopped < limit_s + 120  # the next trial ran, the run ended
    assert processes_in(tmp_path) == []
