"""AiohttpTransport against real sockets: aiohttp's failures arrive as httpx's, so the client
classifies them the same whatever the transport."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from autotune.http_transport import AiohttpTransport
from autotune.replay.client import RequestOutcome, send_request
from autotune.replay.records import RequestError
from tests.replay.conftest import free_port, make_plan

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)


def _against(answer: Answer) -> RequestOutcome:
    async def go() -> RequestOutcome:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _read_request(reader)
            await answer(reader, writer)
            writer.close()

        port = free_port()
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            transport = AiohttpTransport()
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", transport=transport
            ) as client:
                request = make_plan().requests[0]
                return await send_request(
                    client, request, model_name="m", origin_s=time.perf_counter(), timeout_s=5
                )

    return asyncio.run(go())


def test_complete_chunked_stream() -> None:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD)
        writer.write(
            _chunk(b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n')
        )
        writer.write(_chunk(b'data: {"choices":[],"usage":{"completion_tokens":1}}\n\n'))
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    record = _against(answer).record
    assert record.ok and record.chunks == 1 and record.output_tokens == 1


def test_connection_closed_mid_body_is_a_cut_stream() -> None:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD + _chunk(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'))
        writer.write(b"ff\r\npartial")  # a chunk announced, never finished
        await writer.drain()

    record = _against(answer).record
    assert record.error is RequestError.CUT_STREAM and record.chunks == 1


def test_server_error_status_and_body() -> None:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = b'{"error": "KV cache exhausted"}'
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\n\r\n" % len(body))
        writer.write(body)
        await writer.drain()

    record = _against(answer).record
    assert record.error is RequestError.HTTP_5XX and record.http_status == 503
    assert record.error_detail is not None and "KV cache exhausted" in record.error_detail


def test_refused_connection() -> None:
    async def go() -> RequestOutcome:
        url = f"http://127.0.0.1:{free_port()}"
        async with httpx.AsyncClient(base_url=url, transport=AiohttpTransport()) as client:
            return await send_request(client, make_plan().requests[0], model_name="m", origin_s=0.0)

    record = asyncio.run(go()).record
    assert record.error is RequestError.CONNECT and record.http_status is None
