"""No API key is ever stored: record through the proxy, tune with the key, grep everything.

The key travels in both headers clients use (``Authorization: Bearer`` and
``x-api-key``) through `autotune record` to a simulator that demands it, then a
study is run on the recording against servers launched with that key. No file
the run produced (workload, study database, artifacts, server and run logs,
console output) may contain it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import optuna
import pytest

from autotune.redaction import REDACTED
from autotune.sim.server.faults import FAULT_SCHEDULE_ENV
from autotune.trial.record import TrialRecord
from tests.e2e.conftest import (
    REPO,
    SIM_ARGS,
    autotune_argv,
    default_sigint,
    free_port,
    processes_in,
    tuner_args,
    wait_for,
)

SECRET = "sk-autotune-secret-0f9e8d7c6b5a"
FITS_SPACE = REPO / "tests" / "e2e" / "data" / "fits.yaml"


def files_holding(root: Path, secret: str) -> list[Path]:
    """Every file under ``root`` whose bytes contain ``secret``."""
    needle = secret.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1.0).status_code < 500
    except httpx.HTTPError:
        return False


def _record(tmp_path: Path, upstream: str, out: Path) -> None:
    port = free_port()
    argv = autotune_argv(
        "record", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--out", str(out)
    )
    with (tmp_path / "record.out").open("wb") as log:
        recorder = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=default_sigint, cwd=tmp_path
        )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _up(url), timeout_s=30), "recorder did not start"
        headers = {"authorization": f"Bearer {SECRET}", "x-api-key": SECRET}
        with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
            for turn in range(3):
                body = {
                    "model": SIM_ARGS[0],
                    "max_tokens": 16,
                    "messages": [{"role": "user", "content": f"question {turn}: list the files"}],
                }
                chat = client.post("/v1/chat/completions", json=body)
                assert chat.status_code == 200, chat.text  # the key reached the server
                messages = client.post("/v1/messages", json={**body, "stream": True})
                assert messages.status_code == 200, messages.text
        denied = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        assert denied.status_code == 401  # without the key the server refuses: it is needed
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(timeout=30)


@pytest.mark.timeout(240)
def test_an_api_key_through_record_and_run_is_stored_nowhere(tmp_path: Path) -> None:
    port = free_port()
    listen = ("--port", str(port), "--time-scale", "50")
    upstream = subprocess.Popen(
        [sys.executable, "-m", "autotune.sim", "serve", *SIM_ARGS, "--api-key", SECRET, *listen],
        stdout=(tmp_path / "upstream.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert wait_for(lambda: _up(f"http://127.0.0.1:{port}"), timeout_s=40)
        workload = tmp_path / "recorded.jsonl"
        _record(tmp_path, f"http://127.0.0.1:{port}", workload)
    finally:
        os.killpg(upstream.pid, signal.SIGTERM)
        upstream.wait(timeout=15)
    assert workload.exists()

    args = [
        "run", "--workload", str(workload), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", SIM_ARGS[0], "--space", str(FITS_SPACE),
        "--storage", f"sqlite:///{tmp_path / 'autotune.db'}", "--study", "secrets",
        "--sampler", "random", "--trials", "2",
        *tuner_args(tmp_path / "settings", {
            "warm_start": 0, "confirm": 0, "dedup": False, "simulator": {"time_scale": 200},
        }),
    ]  # fmt: skip
    run = subprocess.run(
        autotune_argv(*args),
        cwd=tmp_path,
        env={**os.environ, "VLLM_API_KEY": SECRET},
        capture_output=True,
        timeout=180,
    )
    (tmp_path / "run.out").write_bytes(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout.decode() + run.stderr.decode()
    assert b"401" not in run.stdout  # the servers were reached with the key
    assert list(tmp_path.glob("**/server.log")) or list(tmp_path.glob("**/artifacts/**"))
    assert files_holding(tmp_path, SECRET) == []
    assert processes_in(tmp_path) == []


def test_an_api_key_in_a_space_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    """A flag is stored with every trial and logged: a key there would be kept forever."""
    space = tmp_path / "space.yaml"
    space.write_text(FITS_SPACE.read_text().replace("fixed:\n", f"fixed:\n  api-key: {SECRET}\n"))
    args = ["run", "--workload", str(REPO / "workloads" / "sample-claudecode.jsonl")]
    args += ["--engine", "sim", "--hardware", "rtx4080s-32g", "--model", SIM_ARGS[0]]
    args += ["--space", str(space), "--storage", f"sqlite:///{tmp_path / 'a.db'}"]
    run = subprocess.run(autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"{space}:" in run.stderr and "VLLM_API_KEY" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert files_holding(tmp_path, SECRET) == [space]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "variable", ["VLLM_API_KEY", "PLUGIN_SETTING"], ids=["a-key-variable", "a-key-shaped-value"]
)
def test_a_key_a_server_echoes_is_redacted_in_every_log_attr_and_the_screen(
    tmp_path: Path, variable: str
) -> None:
    """The simulator's --fault-env-error fails each start with a ValueError quoting the
    variable: the key reaches the log by itself, then the failure, the trial's line and the
    study. ``VLLM_API_KEY`` is redacted by its name, ``PLUGIN_SETTING`` by the key's shape."""
    schedule = tmp_path / "faults.txt"
    schedule.write_text(f"--fault-env-error {variable}\n" * 3)
    args = [
        "run", "--workload", str(REPO / "workloads" / "sample-claudecode.jsonl"),
        "--engine", "sim", "--hardware", "rtx4080s-32g", "--model", SIM_ARGS[0],
        "--space", str(FITS_SPACE), "--storage", f"sqlite:///{tmp_path / 'autotune.db'}",
        "--study", "echo", "--sampler", "random", "--trials", "5",
        *tuner_args(tmp_path / "settings", {"warm_start": 0, "confirm": 0, "dedup": False,
                                            "load": {"max_requests": 4},
                                            "simulator": {"time_scale": 200}}),
    ]  # fmt: skip
    env = {**os.environ, variable: SECRET, FAULT_SCHEDULE_ENV: str(schedule), "COLUMNS": "200"}
    run = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200
    )
    screen = run.stdout + run.stderr
    (tmp_path / "run.out").write_text(screen)
    assert run.returncode == 1, screen  # three identical failures: the run stops
    echoed = f"invalid setting {variable}='{REDACTED}'"
    assert screen.count(echoed) >= 4, screen  # each trial's line and the verdict
    run_log = next(tmp_path.glob("runs/*/run.log")).read_text()
    assert echoed in run_log
    server_logs = sorted(tmp_path.glob("runs/*/trial-*/server.log"))
    assert len(server_logs) == 3 and all(echoed in p.read_text() for p in server_logs)
    study = optuna.load_study(study_name="echo", storage=f"sqlite:///{tmp_path / 'autotune.db'}")
    failures = [TrialRecord.read(t.user_attrs).failure for t in study.trials]
    assert [f.message for f in failures if f] == [f"ValueError: {echoed}"] * 3
    assert files_holding(tmp_path, SECRET) == []  # database, artifacts, logs, screen
    assert processes_in(tmp_path) == []
