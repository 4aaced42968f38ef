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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from autotune.http_transport import AiohttpTransport
from autotune.workload.importers.requests_log import SESSION_HEADER
from autotune.workload.plan import Endpoint
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


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when the client hung up before sending it all."""
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
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
        self._base = upstream.rstrip("/")
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
        raw = await _read_body(receive)
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
        url = self._base + (scope.get("raw_path") or path.encode()).decode("latin-1")
        if scope["query_string"]:
            url += "?" + scope["query_string"].decode("latin-1")
        assert self._transport is not None, "lifespan startup did not run"
        request = httpx.Request(scope["method"], url, headers=headers, content=raw)
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            message = f"autotune record: upstream {self._base} unreachable: {type(exc).__name__}"
            await _send_error(send, 502, message)
            return
        exchange = (
            Exchange(endpoint, raw, session_header, start_s, start_perf)
            if endpoint is not None
            else None
        )
        try:
            complete = await self._relay(response, exchange, receive, send)
        finally:
            await response.aclose()
        if exchange is None:
            return
        if complete:
            self._recorder.submit(exchange, status=response.status_code)
        else:
            self._recorder.submit_skip()

    async def _relay(
        self,
        response: httpx.Response,
        exchange: Exchange | None,
        receive: Receive,
        send: Send,
    ) -> bool:
        """Stream ``response`` to the client; False when either side went away."""
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
        gone = asyncio.Event()

        async def watch_client() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch_client())
        try:
            async for chunk in response.stream:  # type: ignore[union-attr]
                if gone.is_set():  # the client went away: stop the upstream too
                    return False
                if exchange is not None:
                    if exchange.first_byte_perf is None:
                        exchange.first_byte_perf = time.perf_counter()
                    exchange.chunks.append(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if exchange is not None:
                exchange.end_perf = time.perf_counter()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return not gone.is_set()
        except httpx.HTTPError as exc:
            _log.warning("autotune record: upstream stream cut: %s", exc)
            return False
        finally:
            watcher.cancel()


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
    )
    return recorder
