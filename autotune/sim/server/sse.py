"""Streaming a RequestStream to the client: vLLM's SSE events, or one JSON body.

``SseResponse`` is a small ASGI response that writes the events and watches for
the client going away, so a disconnect aborts the request in the engine at
once; ``StreamWriter`` turns a request's tokens into the endpoint's shapes.
A lockstep client's request (``sim/server/lockstep.py``) gets one event per engine step,
each write dated by a ``: t=`` comment line in modelled seconds.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from autotune.replay.lockstep_wire import stamp_line
from autotune.sim.server import responses as shapes
from autotune.sim.server.faults import FaultInjector
from autotune.sim.server.scaled_time_loop import EngineDeadError, RequestStream

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


MALFORMED_EVENT = b'data: {"choices": [{"delta": {"content": "trunc\n\n'  # not JSON


class StreamCut(Exception):
    """Raised inside a stream to drop the connection mid-body (--fault-cut-stream-rate)."""


class SseResponse:
    """An SSE body from an async iterator; aborts the request if the client leaves."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        producer = asyncio.ensure_future(self._produce(send))
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            producer.cancel()
            watcher.cancel()
            self._on_close()
        if producer.done() and not producer.cancelled() and producer.exception() is not None:
            raise producer.exception()  # a StreamCut: let the server drop the connection

    async def _produce(self, send: Send) -> None:
        async for chunk in self._events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class StreamWriter:
    """Turns one RequestStream into the endpoint's SSE events or JSON body."""

    def __init__(
        self,
        stream: RequestStream,
        endpoint: str,
        body: dict[str, Any],
        *,
        model_name: str,
        faults: FaultInjector,
        time_scale: float,
    ) -> None:
        self.stream = stream
        self.endpoint = endpoint
        self.model = model_name
        self.faults = faults
        self.time_scale = time_scale
        self.created = int(time.time())
        prefix = {"openai.chat": "chatcmpl-", "openai.completions": "cmpl-"}.get(endpoint, "msg_")
        self.response_id = prefix + uuid.uuid4().hex
        options = body.get("stream_options") or {}
        anthropic = endpoint == "anthropic.messages"
        self.include_usage = anthropic or bool(options.get("include_usage"))
        self.continuous_usage = bool(options.get("continuous_usage_stats"))

    def _usage(self) -> dict[str, Any]:
        s = self.stream
        return shapes.usage(s.prompt_tokens, s.generated_tokens, s.cached_tokens)

    async def _first_token_delay(self) -> None:
        delay_s = self.faults.config.slow_first_token_s
        if delay_s > 0:
            await asyncio.sleep(delay_s / self.time_scale)

    def _stamp(self, t_s: float, end_order: int | None = None) -> bytes:
        """The date line of a clocked write: ``t_s``, or later when the first token is held."""
        first_s = self.stream.first_token_s
        if first_s is not None and self.faults.config.slow_first_token_s > 0:
            t_s = max(t_s, first_s + self.faults.config.slow_first_token_s)
        return stamp_line(t_s, end_order)

    async def collect(self) -> dict[str, Any]:
        """Wait for the whole output; the non-streaming response body."""
        s = self.stream
        first = True
        while await s.next_tokens() or not s.finished:
            if first:
                await self._first_token_delay()
                first = False
        text = shapes.render_tokens(0, s.generated_tokens)
        reason = s.finish_reason or "length"
        if self.endpoint == "openai.chat":
            return shapes.chat_completion(
                self.response_id, self.created, self.model, text, reason, self._usage()
            )
        if self.endpoint == "openai.completions":
            return shapes.text_completion(
                self.response_id, self.created, self.model, text, reason, self._usage()
            )
        usage = shapes.anthropic_usage(s.prompt_tokens, s.generated_tokens, s.cached_tokens)
        stop = shapes.ANTHROPIC_STOP_REASONS.get(reason, "end_turn")
        return shapes.anthropic_message(self.response_id, self.model, text, stop, usage)

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE events of a streaming response, in vLLM's shapes.

        Whatever one wake-up produces (start events, the new tokens, the end
        events) goes out as one write: fewer sends when the process is busy. A clocked
        request gets one token event per engine step, each dated, in that write.
        """
        s = self.stream
        clocked = s.clocked is not None
        cut_after = self.faults.cut_after_tokens(s.max_tokens)
        hang = self.faults.hangs_mid_stream()
        malformed = self.faults.sends_malformed_event()
        sent = 0
        try:
            while True:
                count = await s.next_tokens()  # 0 only once finished
                if cut_after is not None and sent + count > cut_after:
                    raise StreamCut(s.request_id)
                if sent and hang:
                    await asyncio.Event().wait()  # stalls with the connection open
                if sent and malformed:
                    yield MALFORMED_EVENT
                    return
                parts: list[bytes] = []
                if sent == 0:
                    await self._first_token_delay()
                steps: list[tuple[float | None, int]] = [(None, count)]
                if clocked:
                    steps = s.take_deliveries() or [(s.last_token_s or 0.0, count)]
                for index, (t_s, tokens) in enumerate(steps):
                    if t_s is not None:
                        parts.append(self._stamp(t_s))
                    if sent == 0:
                        parts.append(self._start_events())
                    last = s.finished and index == len(steps) - 1
                    parts.append(self._token_events(sent, tokens, last=last))
                    sent += tokens
                if s.finished:
                    if clocked and s.end_s is not None:
                        parts.append(self._stamp(s.end_s, s.end_order))
                    parts.append(self._end_events(sent))
                yield b"".join(parts)
                if s.finished:
                    return
        except EngineDeadError:
            if self.endpoint == "anthropic.messages":
                error = shapes.anthropic_error(shapes.ENGINE_DEAD_MESSAGE, "internal_error")
                yield shapes.sse_event("error", error) + shapes.DONE
            else:
                error = shapes.openai_error(shapes.ENGINE_DEAD_MESSAGE, 500, "InternalServerError")
                yield shapes.sse(error) + shapes.DONE

    def _token_events(self, start: int, count: int, *, last: bool) -> bytes:
        """The event carrying ``count`` new tokens (OpenAI, the ``last``: the finish reason)."""
        s = self.stream
        text = shapes.render_tokens(start, count)
        if self.endpoint == "anthropic.messages":
            return shapes.anthropic_delta(text) if count else b""
        reason = (s.finish_reason or "length") if last else None
        return self._openai_chunk(text, reason)

    def _end_events(self, sent: int) -> bytes:
        s = self.stream
        if self.endpoint == "anthropic.messages":
            usage = shapes.anthropic_usage(s.prompt_tokens, sent, s.cached_tokens)
            stop = shapes.ANTHROPIC_STOP_REASONS.get(s.finish_reason or "", "end_turn")
            return shapes.anthropic_stream_end(stop, usage)
        if not self.include_usage:
            return shapes.DONE
        obj = "chat.completion.chunk" if self.endpoint == "openai.chat" else "text_completion"
        usage_chunk = shapes.usage_chunk(
            self.response_id, self.created, self.model, obj, self._usage()
        )
        return shapes.sse(usage_chunk) + shapes.DONE

    def _start_events(self) -> bytes:
        if self.endpoint == "anthropic.messages":
            s = self.stream
            usage = shapes.anthropic_usage(s.prompt_tokens, 0, s.cached_tokens)
            return shapes.anthropic_stream_start(self.response_id, self.model, usage)
        if self.endpoint == "openai.chat":
            delta = {"role": "assistant", "content": ""}
            chunk = shapes.chat_chunk(self.response_id, self.created, self.model, delta, None)
            return shapes.sse(self._with_usage(chunk))
        return b""

    def _openai_chunk(self, text: str, reason: str | None) -> bytes:
        if self.endpoint == "openai.chat":
            chunk = shapes.chat_chunk(
                self.response_id, self.created, self.model, {"content": text}, reason
            )
        else:
            chunk = shapes.completion_chunk(
                self.response_id, self.created, self.model, text, reason
            )
        return shapes.sse(self._with_usage(chunk))

    def _with_usage(self, chunk: dict[str, Any]) -> dict[str, Any]:
        if self.continuous_usage:
            chunk["usage"] = self._usage()
        return chunk
