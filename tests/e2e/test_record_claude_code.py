"""`autotune record` in front of the simulator process, fed real Claude Code requests.

The billing block is detected and reported once while recording, marked in the
recording's header and reported again by `workload stats`; a 404 for Claude
Code's own model name says what to set; a recorded request replays at its live size.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from autotune.workload import load_plan, read_workload
from tests.e2e.conftest import (
    SIM_MODEL,
    autotune_argv,
    claude_code_request,
    default_sigint,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.8a5; cc_entrypoint=sdk-cli;"


@pytest.fixture
def recorder(long_sim_url: str, tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen]]:
    port = free_port()
    out = tmp_path / "cc.jsonl"
    argv = autotune_argv(
        "record", "--upstream", long_sim_url, "--listen", f"127.0.0.1:{port}", "--out", str(out)
    )
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1.0).status_code < 500
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(up, timeout_s=30), "recorder did not start"
        yield url, out, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def _send(url: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"x-claude-code-session-id": "s1", "x-api-key": "dummy"}
    return httpx.post(f"{url}/v1/messages?beta=true", json=body, headers=headers, timeout=60)


def _stop(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGINT)
    stdout, _ = process.communicate(timeout=30)
    return stdout.decode()


def test_billing_header_is_told_once_marked_and_reported_by_stats(
    recorder: tuple[str, Path, subprocess.Popen], tmp_path: Path
) -> None:
    url, out, process = recorder
    first = {**claude_code_request(), "stream": True, "max_tokens": 8}
    second = json.loads(json.dumps(first))
    second["system"][0]["text"] = BILLING  # what the next real request carried
    second["messages"][0]["content"][-1]["text"] = "list the files here"
    assert _send(url, first).status_code == 200
    assert _send(url, second).status_code == 200
    printed = _stop(process)
    assert "recorded 2 calls" in printed
    assert printed.count("CLAUDE_CODE_ATTRIBUTION_HEADER=0") == 1  # told once
    assert printed.index("x-anthropic-billing-header") < printed.index("recorded 2 calls")
    workload = read_workload(out)
    assert workload.header.source["billing_header_requests"] == 2
    assert "x-anthropic-billing-header" not in out.read_text()  # still dropped from prompts
    stats = subprocess.run(
        autotune_argv("workload", "stats", str(out)), capture_output=True, text=True, timeout=60
    )
    assert stats.returncode == 0, stats.stdout + stats.stderr
    assert "2 recorded requests carried Claude Code's per-request" in stats.stdout
    assert "CLAUDE_CODE_ATTRIBUTION_HEADER=0" in stats.stdout


def test_without_the_billing_header_nothing_is_told_and_replay_matches_live_size(
    recorder: tuple[str, Path, subprocess.Popen], long_sim_url: str
) -> None:
    url, out, process = recorder
    body = {**claude_code_request(), "stream": False, "max_tokens": 8}
    body["system"] = body["system"][1:]  # as with CLAUDE_CODE_ATTRIBUTION_HEADER=0
    live = _send(url, body)
    assert live.status_code == 200
    printed = _stop(process)
    assert "x-anthropic-billing-header" not in printed
    assert "billing_header_requests" not in read_workload(out).header.source
    (request,) = load_plan(out).requests
    replay = {
        "model": SIM_MODEL,
        "system": request.system,
        "messages": [{"role": m.role, "content": m.text} for m in request.messages],
    }
    counted = httpx.post(f"{long_sim_url}/v1/messages/count_tokens", json=replay, timeout=30)
    # The recording holds the tools as the template writes them: same prompt size as live.
    assert counted.json()["input_tokens"] == live.json()["usage"]["input_tokens"]


def test_404_for_claude_codes_own_model_name_says_what_to_set(
    recorder: tuple[str, Path, subprocess.Popen],
) -> None:
    url, _, process = recorder
    body = {**claude_code_request(), "model": "claude-opus-4-8", "max_tokens": 8}
    assert _send(url, body).status_code == 404
    assert _send(url, body).status_code == 404
    printed = _stop(process)
    assert printed.count("ANTHROPIC_MODEL") == 1
    assert "--served-model-name claude-opus-4-8" in printed
    assert "recorded 0 calls" in printed


def test_recorder_cli_help_names_anthropic_model() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "autotune", "record", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "ANTHROPIC_MODEL" in result.stdout


def _record_bodies(sim_url: str, out: Path, bodies: list[tuple[str, dict[str, Any]]], *flags: str):
    """Record (session, body) calls through a fresh `autotune record` process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = autotune_argv(
        "record", "--upstream", sim_url, "--listen", f"127.0.0.1:{port}", "--out", str(out), *flags
    )
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    try:
        assert wait_for(lambda: _answers(f"{url}/health"), timeout_s=30), "recorder did not start"
        for session, body in bodies:
            headers = {"x-claude-code-session-id": session}
            response = httpx.post(f"{url}/v1/messages", json=body, headers=headers, timeout=60)
            assert response.status_code == 200, response.text
        assert f"recorded {len(bodies)} calls" in _stop(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code < 500
    except httpx.HTTPError:
        return False


def _ideal_hit(path: Path) -> float:
    result = subprocess.run(
        autotune_argv("workload", "stats", "--json", str(path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["prefix_hit_ratio"]


def test_anonymize_keeps_a_prefix_two_sessions_share(long_sim_url: str, tmp_path: Path) -> None:
    words = [f"w{index}x" for index in range(2000)]
    shared = " ".join(words[:590])  # the two system prompts share their first 590 words
    bodies = []
    for session, tail in (("s1", words[600:800]), ("s2", words[800:1000])):
        system = f"{shared} {' '.join(tail)}"
        body = {"model": SIM_MODEL, "max_tokens": 4, "system": system}
        bodies.append((session, {**body, "messages": [{"role": "user", "content": "go"}]}))
    plain, anonymized = tmp_path / "plain.jsonl", tmp_path / "anon.jsonl"
    _record_bodies(long_sim_url, plain, bodies)
    _record_bodies(long_sim_url, anonymized, bodies, "--anonymize")
    assert "w5x" not in anonymized.read_text()
    before, after = _ideal_hit(plain), _ideal_hit(anonymized)
    assert before > 0.3
    # Shared to the last whole 64-token block: at most one block of the 590 words is lost.
    assert before - 64 / 1582 <= after <= before
