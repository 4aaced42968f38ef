"""The recording proxy: a streaming pass-through that writes what it sees as a workload.

Requests are forwarded unchanged (the raw body bytes, and the headers, so the
upstream's auth works) and the response bytes are relayed as they arrive.
The hot path is kept short, because the proxy must add no measurable latency:

- a plain ASGI app on uvicorn (no routing or middleware layers per chunk);
- one upstream connection pool over aiohttp (``AiohttpTransport``,
  called directly: httpx's client layers of URL and header merging, auth,
  redirects and cookies have nothing to do for a pass-through), which hands
  over everything already received in one read, so a fast stream is
  relayed in a few large writes rather than one write per SSE event;
- recording happens after the last byte went out, on the recorder's worker
  thread (``autotune.workload.recorder``): the relay only keeps a reference
  to each chunk it forwarded.

Only the session id header is read; no header is ever stored.

It forwards to the configured upstream and nowhere else: the upstream URL is built
from the request's path alone, and a request target that is not a path (the
absolute form ``http://host/...``, an authority such as ``@host:port/...`` or
``host:port``, ``*``) is refused with a 400, so no client can aim it, its
``x-api-key`` or ``authorization`` with it, at another host.

No connection hangs for ever: a request's head must be whole within ``HEAD_TIMEOUT_S``
(``proxy_connection.py``; else the connection is closed), a body is read within
``BODY_IDLE_TIMEOUT_S`` between its parts and ``BODY_TIMEOUT_S`` in all (else 408), up
to ``MAX_BODY_BYTES`` (else 413, before reading when the Content-Length says so); such
an answer closes that connection and the proxy goes on serving. The upstream gets
``UPSTREAM_TIMEOUT``; a client that goes away while the upstream is silent cuts the
upstream request at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from autotune.http_transport import AiohttpTransport
from autotune.workload.importers.requests_log import SESSION_HEADER
from autotune.workload.plan import Endpoint
from autotune.workload.proxy_connection import KEEP_ALIVE_IDLE_S, HeadDeadlineProtocol
from autotune.workload.recorder import FLUSH_INTERVAL_S, Exchange, Recorder

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

RECORDED_PATHS: dict[str, Endpoint] = {
    "/v1/chat/completions": "openai.chat",
    "/v1/completions": "openai.completions",
    "/v1/messages": "anthropic.messages",
}
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"accept-encoding",  # asked as identity, so the recorded copy is readable
    }
)
_SESSION_HEADER = SESSION_HEADER.encode()
_log = logging.getLogger(__name__)

# The Anthropic API's own limit on a Messages request (32 MB): a Claude Code request,
# 200k tokens of context with images, stays well below it.
MAX_BODY_BYTES = 32 * 2**20
# A client has its whole body in memory and sends it at once; 30 s without a byte of it
# is a client that stalled (or lied in its Content-Length / chunk size), not a slow one.
BODY_IDLE_TIMEOUT_S = 30.0
# ... and the whole body within 5 minutes: 32 MiB at 110 kB/s, any link a user records
# over, while a client that trickles a byte at a time cannot hold a connection for ever.
BODY_TIMEOUT_S = 300.0
# Upstream: a TCP connect completes in milliseconds when the host is up (10 s, as the
# replay's); reads may wait 30 minutes, longer than any client does (the OpenAI and
# Anthropic SDKs give up after 10), so the proxy never cuts a request its client still
# waits for, and only frees a connection whose client and upstream both hang. A client
# that goes away cuts the upstream request at once (``_forward``).
UPSTREAM_TIMEOUT = httpx.Timeout(30 * 60.0, connect=10.0)
_CLOSE = (b"connection", b"close")


class _Refused(Exception):
    """A request the proxy answers itself with a 4xx, closing the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _upstream_target(scope: Scope) -> bytes:
    """The request target as a path (query included) to append to the upstream URL.

    Raises _Refused (400) for any other form: absolute (``http://host/x``), authority
    (``host:port``, ``@host:port/x``), asterisk (``*``) or network-path (``//host/x``).
    """
    target = scope.get("raw_path") or scope["path"].encode()
    if not target.startswith(b"/") or target.startswith(b"//"):
        shown = target[:80].decode("latin-1")
        raise _Refused(
            400,
            f"autotune record: request target {shown!r} is not a path; this proxy forwards "
            "to its --upstream only (absolute-form and authority targets are refused)",
        )
    query = scope.get("query_string") or b""
    return target + b"?" + query if query else target


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value)  # the HTTP parser has checked it is digits
    return None


async def _read_body(scope: Scope, receive: Receive) -> bytes | None:
    """The whole request body; None when the client hung up before sending it all.

    Raises _Refused: 413 beyond ``MAX_BODY_BYTES`` (at once when Content-Length says
    so), 408 when the body stalls (``BODY_IDLE_TIMEOUT_S``) or drags (``BODY_TIMEOUT_S``).
    """
    declared = _declared_length(scope)
    if declared is not None and declared > MAX_BODY_BYTES:
        raise _Refused(413, f"autotune record: a {declared:,}-byte body; the limit is "
                       f"{MAX_BODY_BYTES:,} bytes")  # fmt: skip
    parts = []
    size = 0
    deadline = asyncio.get_running_loop().time() + BODY_TIMEOUT_S
    while True:
        wait_s = min(BODY_IDLE_TIMEOUT_S, deadline - asyncio.get_running_loop().time())
        try:
            async with asyncio.timeout(max(wait_s, 0.0)):
                message = await receive()
        except TimeoutError:
            raise _Refused(
                408,
                f"autotune record: the request body did not arrive ({size:,} bytes in; "
                f"{BODY_IDLE_TIMEOUT_S:g} s without a byte, or {BODY_TIMEOUT_S:g} s in all)",
            ) from None
        if message["type"] != "http.request":
            return None
        part = message.get("body", b"")
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise _Refused(413, f"autotune record: the body passed {MAX_BODY_BYTES:,} bytes")
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


async def _send_error(send: Send, status: int, message: str, *, close: bool = False) -> None:
    """A JSON error answer; ``close``: end the connection after it (its request's body
    was not read to the end, so nothing after it on the connection can be trusted)."""
    body = json.dumps({"error": {"message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if close:
        headers.append(_CLOSE)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RecordingProxy:
    """ASGI app forwarding every request to ``upstream``; LLM calls go to ``recorder``.

    ``transport`` may be injected (tests); else one ``AiohttpTransport`` (a
    connection pool) is made at startup and closed at shutdown.
    """

    def __init__(
        self,
        upstream: str,
        recorder: Recorder,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._upstream = httpx.URL(upstream)
        self._upstream_path = self._upstream.raw_path.rstrip(b"/")  # a prefix, e.g. /api
        self._recorder = recorder
        self._injected = transport
        self._transport: httpx.AsyncBaseTransport | None = transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._proxy(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        flusher: asyncio.Task[None] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self._transport is None:
                    self._transport = AiohttpTransport()
                flusher = asyncio.create_task(self._flush_periodically())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if flusher is not None:
                    flusher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await flusher
                if self._injected is None and self._transport is not None:
                    await self._transport.aclose()
                await asyncio.to_thread(self._recorder.close)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            self._recorder.submit_flush()

    async def _proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            target = _upstream_target(scope)
            raw = await _read_body(scope, receive)
        except _Refused as refused:
            await _send_error(send, refused.status, refused.message, close=True)
            return
        if raw is None:
            return
        start_s, start_perf = time.time(), time.perf_counter()
        headers = [(b"accept-encoding", b"identity")]
        session_header = None
        for name, value in scope["headers"]:
            name = name.lower()
            if name in _HOP_BY_HOP:
                continue
            if name == _SESSION_HEADER:
                session_header = value.decode("latin-1")
            headers.append((name, value))
        path = scope["path"]
        endpoint = RECORDED_PATHS.get(path) if scope["method"] == "POST" else None
        url = self._upstream.copy_with(raw_path=self._upstream_path + target)
        request = httpx.Request(
            scope["method"],
            url,
            headers=headers,
            content=raw,
            extensions={"timeout": UPSTREAM_TIMEOUT.as_dict()},
        )
        exchange = (
            Exchange(endpoint, raw, session_header, start_s, start_perf)
            if endpoint is not None
            else None
        )
        answer = _Answer()
        forward = asyncio.create_task(self._forward(request, exchange, answer, send))
        watcher = asyncio.create_task(_cut_when_client_leaves(receive, forward, answer))
        try:
            await forward
        except asyncio.CancelledError:
            if not watcher.done() or not watcher.result():
                raise  # cancelled from outside (shutdown), not by the client leaving
        finally:
            watcher.cancel()
        if exchange is None:
            return
        if answer.complete and answer.status is not None:
            self._recorder.submit(exchange, status=answer.status)
        else:
            self._recorder.submit_skip()

    async def _forward(
        self, request: httpx.Request, exchange: Exchange | None, answer: _Answer, send: Send
    ) -> None:
        """Send ``request`` upstream and relay its answer; ``answer`` says how it went."""
        assert self._transport is not None, "lifespan startup did not run"
        base = str(self._upstream)
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            timed_out = isinstance(exc, httpx.TimeoutException)
            what = "did not answer" if timed_out else "unreachable"
            answer.sending_last = True
            message = f"autotune record: upstream {base} {what}: {type(exc).__name__}"
            await _send_error(send, 504 if timed_out else 502, message)
            return
        try:
            await self._relay(response, exchange, answer, send)
        finally:
            await response.aclose()

    async def _relay(
        self, response: httpx.Response, exchange: Exchange | None, answer: _Answer, send: Send
    ) -> None:
        """Stream ``response`` to the client as it arrives."""
        response_headers = [
            (name, value) for name, value in response.headers.raw if name not in _HOP_BY_HOP
        ]
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": response_headers,
            }
        )
        try:
            async for chunk in response.stream:  # type: ignore[union-attr]
                if exchange is not None:
                    if exchange.first_byte_perf is None:
                        exchange.first_byte_perf = time.perf_counter()
                    exchange.chunks.append(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            _log.warning("autotune record: upstream stream cut: %s", exc)
            return
        if exchange is not None:
            exchange.end_perf = time.perf_counter()
        answer.sending_last = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        answer.status, answer.complete = response.status_code, True


@dataclass(slots=True)
class _Answer:
    """How one request's answer went: complete (with the upstream's status), or not."""

    sending_last: bool = False  # its last message is being sent: a disconnect now is the end
    complete: bool = False
    status: int | None = None


async def _cut_when_client_leaves(
    receive: Receive, forward: asyncio.Task[None], answer: _Answer
) -> bool:
    """Cancel ``forward`` when the client disconnects before its answer is out (the
    upstream request is then closed too); True when it did."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if answer.sending_last or forward.done():  # the server reports the end as a disconnect
        return False
    forward.cancel()
    return True


def build_app(
    upstream: str, recorder: Recorder, *, transport: httpx.AsyncBaseTransport | None = None
) -> RecordingProxy:
    """The proxy app. ``transport`` may be injected (tests); else one is made per app."""
    return RecordingProxy(upstream, recorder, transport=transport)


def serve(
    upstream: str,
    host: str,
    port: int,
    out: Path,
    *,
    anonymize: bool = False,
    notify: Callable[[str], None] | None = None,
) -> Recorder:
    """Run the proxy until interrupted; returns the recorder (its file is written).

    ``notify`` tells the user about problems in the traffic (once each)."""
    recorder = Recorder(out, anonymize=anonymize)
    if notify is not None:
        recorder.notify = notify
    uvicorn.run(
        build_app(upstream, recorder),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        server_header=False,  # the upstream's own Server and Date headers pass through
        date_header=False,
        http=HeadDeadlineProtocol,
        timeout_keep_alive=KEEP_ALIVE_IDLE_S,
    )
    return recorder
