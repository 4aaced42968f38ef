"""`autotune record` against hostile or broken clients, as real processes: the simulator
upstream, the recorder in front of it, and a listening socket standing for "another
host" that must receive nothing. Targets that aim elsewhere get a 400, absurd or stalled
bodies a 4xx, a client that leaves cuts its upstream request, and the next good request
is served and recorded."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autotune.errors import WorkloadError
from autotune.workload import read_workload
from autotune.workload.proxy import MAX_BODY_BYTES
from autotune.workload.proxy_connection import HEAD_TIMEOUT_S
from tests.e2e.conftest import SIM_ARGS, default_sigint, wait_for
from tests.replay.conftest import free_port, wait_ready

pytestmark = pytest.mark.timeout(120)
SECRET = "sk-never-send-me-elsewhere-24"
CHAT = {"model": "qwen3.6-27b-awq", "max_tokens": 8, "stream": True,
        "messages": [{"role": "user", "content": "Say hello."}]}  # fmt: skip


class OtherHost:
    """A listening socket standing for another host: it notes every connection it gets."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.received: list[bytes] = []  # one entry per connection: what it was sent
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(1.0)
            with conn:
                try:
                    self.received.append(conn.recv(65536))
                except OSError:
                    self.received.append(b"")

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        self._sock.close()


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=default_sigint,
        )  # fmt: skip


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


def start_pair(tmp: Path, *sim_faults: str) -> tuple[int, int, Path, list[subprocess.Popen]]:
    """The simulator and `autotune record` in front of it: (recorder port, simulator
    port, the recording, the processes)."""
    sim_port, port = free_port(), free_port()
    sim = _start(
        [sys.executable, "-m", "autotune.sim", "serve", *SIM_ARGS, *sim_faults,
         "--port", str(sim_port), "--time-scale", "50"],
        tmp / "sim.log",
    )  # fmt: skip
    wait_ready(f"http://127.0.0.1:{sim_port}", sim, timeout_s=60)
    out = tmp / "recorded.jsonl"
    recorder = _start(
        [sys.executable, "-m", "autotune", "record", "--upstream", f"http://127.0.0.1:{sim_port}",
         "--listen", f"127.0.0.1:{port}", "--out", str(out)],
        tmp / "recorder.log",
    )  # fmt: skip
    assert wait_for(lambda: _answers(f"http://127.0.0.1:{port}/health"), timeout_s=30)
    return port, sim_port, out, [recorder, sim]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path, OtherHost]]:
    other = OtherHost()
    port, _, out, processes = start_pair(tmp_path_factory.mktemp("record"))
    try:
        yield port, out, other
    finally:
        for process in processes:
            _stop(process)
        other.close()


def _send_all(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the server may answer and close before the end
        sock.sendall(data)


def _raw(port: int, data: bytes, *, wait_s: float = 10.0) -> tuple[int | None, bytes, bool]:
    """Send ``data`` on a fresh connection (reading meanwhile); (status, body, whether the
    server closed the connection after its answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sender = threading.Thread(target=_send_all, args=(sock, data), daemon=True)
        sender.start()
        received = b""
        try:
            while b"\r\n\r\n" not in received:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
            head, _, body = received.partition(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")),
                0,
            )  # fmt: skip
            while len(body) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
            sock.settimeout(2.0)
            try:
                closed = sock.recv(1) == b""
            except ConnectionResetError:  # closed with our unread bytes still coming in
                closed = True
        except TimeoutError:
            return None, received, False
        finally:
            with contextlib.suppress(OSError):  # unblocks the sender, if it still sends
                sock.shutdown(socket.SHUT_RDWR)
            sender.join(timeout=10)
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else None
    return status, body, closed


def _good_request(port: int) -> str:
    headers = {"authorization": f"Bearer {SECRET}", "x-api-key": SECRET}
    with httpx.stream(
        "POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, headers=headers,
        timeout=30,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        return response.read().decode()


def _recorded(out: Path) -> int:
    """Requests in the recording so far (it is rewritten at most once a second)."""
    try:
        return len(read_workload(out).requests)
    except (OSError, WorkloadError):
        return 0


def test_targets_that_aim_elsewhere_are_refused_and_reach_nobody(
    proxy: tuple[int, Path, OtherHost],
) -> None:
    """Before: `POST @127.0.0.1:PORT/steal` went to PORT with the client's x-api-key and a
    Basic header made of the upstream's host and port."""
    port, out, other = proxy
    elsewhere = f"127.0.0.1:{other.port}"
    body = json.dumps(CHAT).encode()
    answers = []
    for method, target, auth in [
        ("POST", f"@{elsewhere}/v1/chat/completions", ""),  # userinfo: the host after the @
        ("POST", f"@{elsewhere}/v1/chat/completions", f"authorization: Bearer {SECRET}\r\n"),
        ("POST", f"http://{elsewhere}/v1/chat/completions", ""),  # absolute form
        ("POST", f"//{elsewhere}/v1/chat/completions", ""),  # network-path
        ("CONNECT", elsewhere, ""),  # authority form
        ("OPTIONS", "*", ""),  # asterisk form
    ]:
        request = (
            f"{method} {target} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nx-api-key: {SECRET}\r\n"
            f"{auth}content-length: {len(body)}\r\n\r\n"
        ).encode() + body
        status, answer, closed = _raw(port, request)
        answers.append((target, status, b"not a path" in answer, closed))
    assert other.received == []  # no connection at all, so no key either
    assert answers == [(target, 400, True, True) for target, *_ in answers]
    assert "data: [DONE]" in _good_request(port)  # the next request is served ...
    assert wait_for(lambda: _recorded(out) >= 1, timeout_s=10)  # ... and recorded
    assert other.received == []
    assert SECRET not in out.read_text()


def test_absurd_bodies_get_a_4xx_at_once_and_the_proxy_keeps_serving(
    proxy: tuple[int, Path, OtherHost],
) -> None:
    """Before: a Content-Length of a petabyte held the connection for ever, and a
    33-MiB chunked body was read whole and forwarded."""
    port, out, other = proxy
    head = f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-api-key: {SECRET}\r\n"
    started = time.monotonic()
    status, answer, closed = _raw(
        port, (head + "content-length: 10" + "0" * 14 + "\r\n\r\n{").encode()
    )
    assert (status, closed) == (413, True), answer
    assert time.monotonic() - started < 5
    part = b"x" * 2**20
    chunked = (head + "transfer-encoding: chunked\r\n\r\n").encode()
    chunked += b"".join(
        b"%x\r\n%s\r\n" % (len(part), part) for _ in range(MAX_BODY_BYTES // len(part) + 1)
    )
    status, answer, closed = _raw(port, chunked + b"0\r\n\r\n")
    assert (status, closed) == (413, True), answer
    before = _recorded(out)
    assert "data: [DONE]" in _good_request(port)
    assert wait_for(lambda: _recorded(out) == before + 1, timeout_s=10)
    assert other.received == []


@pytest.mark.faults
@pytest.mark.timeout(150)
def test_a_stalled_body_is_a_408_and_the_proxy_keeps_serving(
    proxy: tuple[int, Path, OtherHost],
) -> None:
    """A huge chunk size, or a Content-Length the client never fills, then silence.

    Before: each held its connection for ever."""
    port, _, _ = proxy
    head = "POST /v1/messages HTTP/1.1\r\nhost: x\r\n"
    stalls = [
        (head + "transfer-encoding: chunked\r\n\r\nfffffffff\r\n" + "x" * 100).encode(),
        (head + "content-length: 5000\r\n\r\n" + "{" * 10).encode(),
    ]
    answers: list[tuple[int | None, bytes, bool]] = []
    threads = [
        threading.Thread(target=lambda data=data: answers.append(_raw(port, data, wait_s=60)))
        for data in stalls
    ]  # both at once: each waits out the body timeout
    started = time.monotonic()
    for thread in threads:
        thread.start()
    assert "data: [DONE]" in _good_request(port)  # served meanwhile
    for thread in threads:
        thread.join(timeout=90)
    assert [(status, closed) for status, _, closed in answers] == [(408, True)] * 2, answers
    assert 25 < time.monotonic() - started < 60
    assert "data: [DONE]" in _good_request(port)


def _established_to(pid: int, port: int) -> int:
    """TCP connections of process ``pid`` to 127.0.0.1:``port`` that are established."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    count = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port == port and fields[3] == "01" and fields[9] in inodes:
            count += 1
    return count


def test_a_client_that_leaves_cuts_its_upstream_request(tmp_path: Path) -> None:
    """The upstream never answers (the simulator's --fault-never-stream); the client
    gives up. Before: the proxy held the upstream request open for ever."""
    port, sim_port, _, processes = start_pair(tmp_path, "--fault-never-stream")
    recorder = processes[0]
    try:
        body = json.dumps(CHAT).encode()
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            f"\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request)
            assert wait_for(lambda: _established_to(recorder.pid, sim_port) == 1, timeout_s=10)
        assert wait_for(lambda: _established_to(recorder.pid, sim_port) == 0, timeout_s=10)
        assert recorder.poll() is None
    finally:
        for process in processes:
            _stop(process)


def _held_for_s(port: int, head: bytes, trickle_s: float, give_up_s: float) -> float | None:
    """Open a connection, send ``head`` then a header line every ``trickle_s`` (an empty
    ``head``: nothing at all); seconds until the proxy closed it, None if it never did."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(trickle_s)
        with contextlib.suppress(OSError):
            sock.sendall(head)
        while time.monotonic() - started < give_up_s:
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                if head:
                    with contextlib.suppress(OSError):
                        sock.sendall(b"x-trickle: 1\r\n")
            except OSError:
                return time.monotonic() - started
    return None


def test_slow_or_silent_heads_are_closed_at_the_head_deadline(
    proxy: tuple[int, Path, OtherHost],
) -> None:
    """20 clients trickle a header line every second, 5 send nothing. Before: each held
    its connection (a descriptor) for as long as it trickled."""
    port, out, _ = proxy
    head = b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n"
    held: list[float | None] = []
    threads = [
        threading.Thread(target=lambda h=h: held.append(_held_for_s(port, h, 1.0, 25.0)))
        for h in [head] * 20 + [b""] * 5
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    before = _recorded(out)
    assert "data: [DONE]" in _good_request(port)  # served meanwhile
    for thread in threads:
        thread.join(timeout=40)
    assert len(held) == 25 and None not in held, held
    assert all(HEAD_TIMEOUT_S - 1 < s < HEAD_TIMEOUT_S + 5 for s in held), held  # type: ignore[operator]
    assert "data: [DONE]" in _good_request(port)
    assert wait_for(lambda: _recorded(out) == before + 2, timeout_s=10)
