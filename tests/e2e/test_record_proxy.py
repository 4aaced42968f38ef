"""`autotune record` between a streaming client and the simulator process, then replayed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autotune.workload import load_plan, read_workload
from autotune.workload.schema import DeltaInput
from autotune.workload.tokenizer import WordTokenizer
from tests.e2e.conftest import default_sigint, wait_for

pytestmark = pytest.mark.timeout(90)
SECRET = "sk-test-never-store-me-42"
SESSION = "0b7c9a6e-session"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code < 500
    except httpx.HTTPError:
        return False


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        os.killpg(process.pid, sig)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


@pytest.fixture
def sim_url(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    argv = [
        sys.executable, "-m", "autotune.sim", "serve", "qwen3.6-27b-awq",
        "--hardware", "rtx4080s-32g", "--kv-cache-memory-bytes", "9G",
        "--language-model-only", "--port", str(port), "--time-scale", "50",
    ]  # fmt: skip
    log = (tmp_path / "sim.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _healthy(f"{url}/health"), timeout_s=40), "simulator did not start"
        yield url
    finally:
        _stop(process)
        log.close()


@pytest.fixture
def recorder(sim_url: str, tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    port = _free_port()
    out = tmp_path / "recorded.jsonl"
    argv = [
        sys.executable, "-m", "autotune", "record", "--upstream", sim_url,
        "--listen", f"127.0.0.1:{port}", "--out", str(out),
    ]  # fmt: skip
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _healthy(f"{url}/health"), timeout_s=30), "recorder did not start"
        yield url, out, process
    finally:
        _stop(process, signal.SIGKILL)


def _stream(client: httpx.Client, path: str, body: dict[str, object]) -> tuple[str, bytes]:
    """Send a streaming request; return the concatenated text deltas and the raw bytes."""
    text: list[str] = []
    raw = b""
    headers = {
        "authorization": f"Bearer {SECRET}",
        "x-api-key": SECRET,
        "x-claude-code-session-id": SESSION,
    }
    with client.stream("POST", path, json=body, headers=headers) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            raw += chunk
    for line in raw.splitlines():
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            delta = event.get("delta") or {}
            if isinstance(delta, dict) and delta.get("text"):
                text.append(delta["text"])
            for choice in event.get("choices") or []:
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text), raw


def test_record_round_trips_anthropic_and_openai_streams(
    recorder: tuple[str, Path, subprocess.Popen[bytes]], sim_url: str
) -> None:
    url, out, process = recorder
    model = "qwen3.6-27b-awq"
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=abc;"},
        {"type": "text", "text": "You are a coding agent. Use tools."},
    ]
    first = [{"role": "user", "content": "Read the file main.py please"}]
    with httpx.Client(base_url=url, timeout=30) as client:
        body = {"model": model, "max_tokens": 12, "stream": True, "system": system}
        text1, raw1 = _stream(client, "/v1/messages?beta=true", {**body, "messages": first})
        assert b"message_stop" in raw1 and text1
        second = [
            *first,
            {"role": "assistant", "content": [{"type": "text", "text": text1}]},
            {"role": "user", "content": [{"type": "tool_result", "content": "print(1)"}]},
        ]
        _stream(client, "/v1/messages?beta=true", {**body, "messages": second})
        count = client.post("/v1/messages/count_tokens", json={"model": model, "messages": first})
        assert count.status_code == 200  # passed through, not recorded
        chat = {
            "model": model,
            "max_tokens": 6,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        turn1 = [{"role": "user", "content": "hello there"}]
        text3, raw3 = _stream(client, "/v1/chat/completions", {**chat, "messages": turn1})
        assert b"[DONE]" in raw3
        turn2 = [*turn1, {"role": "assistant", "content": text3}, {"role": "user", "content": "ok"}]
        _stream(client, "/v1/chat/completions", {**chat, "messages": turn2})
    process.send_signal(signal.SIGINT)  # graceful: the final flush
    stdout, _ = process.communicate(timeout=20)
    assert b"recorded 4 calls" in stdout

    text = out.read_text()
    assert SECRET not in text and "billing-header" not in text
    workload = read_workload(out)
    ids = [r.id for r in workload.requests]
    a1, a2, o1, o2 = workload.requests
    assert (a1.endpoint, o1.endpoint) == ("anthropic.messages", "openai.chat")
    assert a1.session == a2.session == SESSION
    assert isinstance(a2.input, DeltaInput) and a2.parent == a1.id
    assert isinstance(o2.input, DeltaInput) and o2.parent == o1.id
    usage = [json.loads(line[6:]).get("usage") for line in raw3.splitlines() if b"usage" in line]
    assert o1.output.tokens == usage[-1]["completion_tokens"]  # from the stream's usage
    assert a1.expect and a1.expect["e2e_s"] >= a1.expect["first_byte_s"] > 0

    plan = load_plan(out)
    replayed = {r.id: r for r in plan.requests}
    assert [m.text for m in replayed[ids[1]].messages] == [
        "Read the file main.py please",
        text1,
        "print(1)",
    ]
    assert replayed[ids[1]].system == "You are a coding agent. Use tools."
    # the recorded file replays against the simulator
    request = replayed[ids[3]]
    with httpx.Client(base_url=sim_url, timeout=30) as client:
        messages = [{"role": m.role, "content": m.text} for m in request.messages]
        response = client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": messages, "max_tokens": request.output_tokens},
        )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] <= request.output_tokens


def test_record_anonymize_keeps_structure_not_text(sim_url: str, tmp_path: Path) -> None:
    port = _free_port()
    out = tmp_path / "anon.jsonl"
    argv = [
        sys.executable, "-m", "autotune", "record", "--upstream", sim_url,
        "--listen", f"127.0.0.1:{port}", "--out", str(out), "--anonymize",
    ]  # fmt: skip
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _healthy(f"{url}/health"), timeout_s=30)
        secret_words = "zebra quantum marmalade"
        turn1 = [{"role": "user", "content": f"tell me about {secret_words}"}]
        with httpx.Client(base_url=url, timeout=30) as client:
            body = {"model": "qwen3.6-27b-awq", "max_tokens": 5, "stream": True}
            text1, _ = _stream(client, "/v1/chat/completions", {**body, "messages": turn1})
            reply = {"role": "assistant", "content": text1}
            turn2 = [*turn1, reply, {"role": "user", "content": "more"}]
            _stream(client, "/v1/chat/completions", {**body, "messages": turn2})
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=20)
    finally:
        _stop(process, signal.SIGKILL)
    assert "zebra" not in out.read_text()
    first, second = load_plan(out).requests
    # As many synthetic words as the original's tokens (" marmalade" is two).
    assert first.prompt_tokens == WordTokenizer().count("tell me about zebra quantum marmalade")
    assert first.prompt_tokens == 7
    assert second.after == (first.id,)
    assert second.messages[0] is first.messages[0]


def test_record_stops_upstream_when_client_leaves_and_keeps_serving(
    recorder: tuple[str, Path, subprocess.Popen[bytes]],
) -> None:
    url, out, process = recorder
    body = {
        "model": "qwen3.6-27b-awq",
        "max_tokens": 4000,
        "stream": True,
        "messages": [{"role": "user", "content": "write a long story"}],
    }
    with httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            next(response.iter_raw())  # one piece, then hang up mid-stream
        short = {**body, "max_tokens": 3, "stream": False}
        answer = client.post("/v1/chat/completions", json=short)
        assert answer.status_code == 200
        assert answer.json()["usage"]["completion_tokens"] <= 3
    process.send_signal(signal.SIGINT)
    stdout, _ = process.communicate(timeout=20)
    assert b"recorded 1 calls" in stdout and b"(1 not recorded" in stdout
    (request,) = read_workload(out).requests
    assert request.output.tokens <= 3


def test_record_answers_502_when_upstream_is_down(tmp_path: Path) -> None:
    port = _free_port()
    argv = [
        sys.executable, "-m", "autotune", "record", "--upstream", f"http://127.0.0.1:{_free_port()}",
        "--listen", f"127.0.0.1:{port}", "--out", str(tmp_path / "none.jsonl"),
    ]  # fmt: skip
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _answers(f"{url}/v1/models"), timeout_s=30), (
            "recorder did not start"
        )
        response = httpx.post(f"{url}/v1/chat/completions", json={"model": "m"}, timeout=10)
        assert response.status_code == 502
        assert "unreachable" in response.json()["error"]["message"]
    finally:
        _stop(process, signal.SIGKILL)
