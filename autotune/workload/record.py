"""The recording proxy: a streaming pass-through that writes what it sees as a workload.

Requests to the LLM endpoints are forwarded unchanged (headers included, so
the upstream's auth works) and the response bytes are streamed back as they
arrive; a copy of the response is parsed only after the stream ends, so the
proxy adds no work to the stream itself. Only the session id header is read;
no header is ever stored. The workload file is rewritten atomically, at most
every ``FLUSH_INTERVAL_S`` and on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from autotune.workload.builder import ObservedCall, WorkloadBuilder
from autotune.workload.importers.requests_log import session_key
from autotune.workload.io import write_workload
from autotune.workload.plan import Endpoint
from autotune.workload.render import render
from autotune.workload.sse import summarize_response

FLUSH_INTERVAL_S = 1.0
RECORDED_PATHS: dict[str, Endpoint] = {
    "/v1/chat/completions": "openai.chat",
    "/v1/completions": "openai.completions",
    "/v1/messages": "anthropic.messages",
}
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",  # asked as identity, so the recorded copy is readable
}


@dataclass
class Recorder:
    """Accumulates observed calls and writes the workload file."""

    out: Path
    anonymize: bool = False
    builder: WorkloadBuilder = field(init=False)
    recorded: int = 0
    skipped: int = 0
    _dirty: bool = False

    def __post_init__(self) -> None:
        self.builder = WorkloadBuilder(
            name=self.out.stem, source={"kind": "recorder"}, anonymize=self.anonymize
        )

    def observe(self, observed: ObservedCall) -> None:
        self.builder.add(observed)
        self.recorded += 1
        self._dirty = True

    def flush(self) -> None:
        """Write the workload so far (atomically) if anything changed."""
        if self._dirty and self.builder.entries:
            self._dirty = False
            write_workload(self.out, self.builder.workload().records())

    async def flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            self.flush()


def _forward_headers(headers: Any) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
    out["accept-encoding"] = "identity"
    return out


def _response_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}


@dataclass
class _Exchange:
    """One proxied call, filled in while its response streams."""

    endpoint: Endpoint | None
    raw_body: bytes
    headers: Headers
    start_s: float
    start_perf: float
    first_byte_perf: float | None = None
    end_perf: float = 0.0
    chunks: list[bytes] = field(default_factory=list)
    complete: bool = False


def _parse_body(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def build_app(
    upstream: str, recorder: Recorder, *, client: httpx.AsyncClient | None = None
) -> Starlette:
    """The proxy app. ``client`` may be injected (tests); else one is made per app."""
    base = upstream.rstrip("/")
    state: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["client"] = client or httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
        flusher = asyncio.create_task(recorder.flush_periodically())
        try:
            yield
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            recorder.flush()
            if client is None:
                await state["client"].aclose()

    def finish(exchange: _Exchange, status: int) -> None:
        """Parse and record a finished call (runs after its last byte was sent)."""
        end_perf = exchange.end_perf
        if exchange.endpoint is None or not exchange.complete:
            return
        body = _parse_body(exchange.raw_body)
        if body is None or not 200 <= status < 300:
            recorder.skipped += 1
            return
        summary = summarize_response(b"".join(exchange.chunks))
        expect: dict[str, object] = {"e2e_s": round(end_perf - exchange.start_perf, 4)}
        if exchange.first_byte_perf is not None:
            expect["first_byte_s"] = round(exchange.first_byte_perf - exchange.start_perf, 4)
        if summary.input_tokens is not None:
            expect["input_tokens"] = summary.input_tokens
        if summary.cached_tokens is not None:
            expect["cached_tokens"] = summary.cached_tokens
        recorder.observe(
            ObservedCall(
                call=render(exchange.endpoint, body),
                session_key=session_key(dict(exchange.headers), body),
                start_s=exchange.start_s,
                end_s=exchange.start_s + (end_perf - exchange.start_perf),
                output_tokens=summary.output_tokens,
                output_text=summary.text or None,
                expect=expect,
            )
        )

    async def proxy(request: Request) -> Response:
        raw = await request.body()
        path = request.url.path
        exchange = _Exchange(
            endpoint=RECORDED_PATHS.get(path) if request.method == "POST" else None,
            raw_body=raw,
            headers=request.headers,
            start_s=time.time(),
            start_perf=time.perf_counter(),
        )
        url = base + path + (f"?{request.url.query}" if request.url.query else "")
        http = state["client"]
        upstream_request = http.build_request(
            request.method, url, headers=_forward_headers(request.headers), content=raw
        )
        try:
            response = await http.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            message = f"autotune record: upstream {base} unreachable: {type(exc).__name__}"
            return JSONResponse({"error": {"message": message}}, status_code=502)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_raw():
                    if exchange.first_byte_perf is None:
                        exchange.first_byte_perf = time.perf_counter()
                    if exchange.endpoint is not None:
                        exchange.chunks.append(chunk)
                    yield chunk
                exchange.end_perf = time.perf_counter()
                exchange.complete = True
            finally:
                if not exchange.complete:  # the client went away: nothing to record
                    await response.aclose()
                    recorder.skipped += 1

        async def close() -> None:  # after the last byte went out: parse off the stream path
            await response.aclose()
            finish(exchange, response.status_code)

        return StreamingResponse(
            relay(),
            status_code=response.status_code,
            headers=_response_headers(response.headers),
            background=BackgroundTask(close),
        )

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", proxy, methods=methods)], lifespan=lifespan)


def serve(upstream: str, host: str, port: int, out: Path, *, anonymize: bool = False) -> Recorder:
    """Run the proxy until interrupted; returns the recorder (its file is written)."""
    recorder = Recorder(out, anonymize=anonymize)
    app = build_app(upstream, recorder)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    return recorder
