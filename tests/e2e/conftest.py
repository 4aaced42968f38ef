"""Helpers for end-to-end tests that drive the real `autotune` command and real servers."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from autotune.cli import app
from tests.e2e.postgres import PostgresMissing, create_database, postgres_server
from tests.replay.conftest import free_port, wait_ready

REPO = Path(__file__).resolve().parents[2]
SAMPLE_WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
CLAUDE_CODE_FIXTURES = REPO / "tests" / "fixtures" / "claude_code"
SIM_MODEL = "qwen3.6-27b-awq"


def claude_code_request() -> dict[str, Any]:
    """A real Claude Code /v1/messages body (24 tools, the billing header, a 6 KB system)."""
    return json.loads((CLAUDE_CODE_FIXTURES / "messages_1.json").read_text())


@pytest.fixture(scope="module")
def long_sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A simulator process with room for Claude Code's long prompts (prefix caching on)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "autotune.sim", "serve", SIM_MODEL, "--hardware", "h200-141g",
        "--kv-cache-memory-bytes", "40G", "--max-model-len", "131072", "--enable-prefix-caching",
        "--language-model-only", "--port", str(port), "--time-scale", "50",
    ]  # fmt: skip
    log = (tmp_path_factory.mktemp("sim") / "sim.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(healthy, timeout_s=40), "simulator did not start"
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
        log.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A real PostgreSQL server for the session (tests/e2e/postgres.py); skips if missing."""
    try:
        with postgres_server() as url:
            yield url
    except PostgresMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def postgres_url(postgres: str) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return create_database(postgres)


SimFactory = Callable[[float], str]
SIM_ARGS = (
    "qwen3.6-27b-awq", "--hardware", "rtx4080s-32g", "--kv-cache-memory-bytes", "9G",
    "--language-model-only", "--enable-prefix-caching", "--startup-s", "0",
)  # fmt: skip


def start_sims(log_dir: Path) -> Iterator[SimFactory]:
    """Start simulators serving SIM_ARGS (``start(time_scale)`` -> url); stop them after."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(time_scale: float) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "autotune.sim", "serve", *SIM_ARGS]
        argv += ["--port", str(port), "--time-scale", str(time_scale)]
        log = (log_dir / f"sim-{port}.log").open("wb")
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process, timeout_s=60)
        return url

    yield start
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def default_sigint() -> None:
    """preexec_fn: SIGINT back to its default in a child, however pytest was started.

    A shell starts a background job (``pytest ... &``) with SIGINT ignored, and every
    child inherits that; a test that sends SIGINT must not depend on it.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def tuner_args(directory: Path, *layers: dict[str, Any]) -> list[str]:
    """``--tuner FILE`` holding the settings ``layers`` merge into (a later layer's key
    wins; the load:, simulator: and engine: sections merge key by key), written once
    per content under ``directory``."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict):
                value = {**merged.get(key, {}), **value}
            merged[key] = value
    text = yaml.safe_dump(merged, sort_keys=True)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"tuner-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    path.write_text(text)
    return ["--tuner", str(path)]


def autotune_argv(*args: str) -> list[str]:
    """The real CLI, as a subprocess of this interpreter."""
    return [sys.executable, "-m", "autotune", *args]


def autotune_in_process(*args: str, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI app in-process, for commands that start no process (show, export...):
    the same output without a subprocess's 2-3 s interpreter start."""
    env = {} if columns is None else {"COLUMNS": str(columns)}
    result = CliRunner().invoke(app, list(args), env=env)
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def sim_server_pids(parent: int | None = None) -> list[int]:
    """PIDs of simulator server processes, optionally only children of ``parent``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if b"autotune.sim" not in cmdline or b"serve" not in cmdline:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if parent is None or ppid == parent:
            pids.append(int(entry.name))
    return pids


def processes_in(cwd: Path) -> list[int]:
    """Live processes whose working directory is ``cwd`` (servers inherit it from autotune)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == cwd and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(predicate, *, timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False


@pytest.fixture
def spawn() -> Iterator:
    """Start `autotune ...` subprocesses in their own groups; kill leftovers at teardown.

    Output goes to ``<cwd>/autotune.out`` (read it with ``output``), never to a pipe
    nobody drains.
    """
    started: list[subprocess.Popen] = []

    def start(*args: str, cwd: Path) -> subprocess.Popen:
        with (cwd / "autotune.out").open("w") as out:
            process = subprocess.Popen(
                autotune_argv(*args),
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=default_sigint,
                env={**os.environ, "COLUMNS": "200"},
            )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def output(cwd: Path) -> str:
    """What a process started by ``spawn`` in ``cwd`` has printed so far."""
    path = cwd / "autotune.out"
    return path.read_text() if path.exists() else ""


def trial_logs(runs: Path) -> dict[int, Path]:
    """Server logs of the trials started so far under a runs directory, by trial number."""
    return {int(path.parent.name.split("-")[1]): path for path in runs.glob("*/trial-*/server.log")}
