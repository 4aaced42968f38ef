"""Fixtures: a stub vLLM server in a subprocess, and small WorkloadPlans built in code."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from autotune.workload.plan import Endpoint, Message, PlannedRequest, WorkloadPlan

REPO_ROOT = Path(__file__).resolve().parents[2]
StubFactory = Callable[..., str]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early with code {process.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"server at {url} not ready within {timeout_s}s")


def _stub_factory() -> Iterator[StubFactory]:
    processes: list[subprocess.Popen[bytes]] = []

    def start(**options: float | str) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "tests.replay.stub_server", "--port", str(port)]
        for name, value in options.items():  # a value of "" is a flag
            argv += [f"--{name.replace('_', '-')}", *([str(value)] if value != "" else [])]
        process = subprocess.Popen(argv, cwd=REPO_ROOT)
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process)
        return url

    yield start
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def stub_server() -> Iterator[StubFactory]:
    """Start stub servers (``stub_server(ttft_s=..., itl_s=..., max_running=...)`` -> url)."""
    yield from _stub_factory()


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    """One stub server with default timings (TTFT 20 ms, ITL 2 ms) for a whole test module."""
    for start in _stub_factory():
        yield start()


def make_plan(
    *,
    sessions: int = 1,
    turns: int = 1,
    output_tokens: int = 8,
    gap_s: float = 0.0,
    arrival_step_s: float = 0.0,
    endpoint: Endpoint = "openai.chat",
) -> WorkloadPlan:
    """``sessions`` x ``turns`` requests; turn k waits for turn k-1 plus ``gap_s``."""
    requests = []
    arrival = 0.0
    for s in range(sessions):
        history: tuple[Message, ...] = ()
        previous: str | None = None
        for t in range(turns):
            history = (*history, Message("user", f"session {s} turn {t} question words here"))
            request_id = f"s{s}-t{t}"
            requests.append(
                PlannedRequest(
                    id=request_id,
                    session=f"s{s}",
                    thread="main",
                    after=(previous,) if previous else (),
                    gap_s=gap_s if previous else 0.0,
                    arrival_s=arrival,
                    endpoint=endpoint,
                    system="You are a stub.",
                    messages=history,
                    prompt_tokens=6 * (t + 1),
                    output_tokens=output_tokens,
                )
            )
            history = (*history, Message("assistant", "answer"))
            previous = request_id
            arrival += arrival_step_s
    requests.sort(key=lambda request: request.arrival_s)
    return WorkloadPlan(name="test", requests=tuple(requests), token_space="words", digest="x")
