"""Measure what `autotune record` adds to a stream: direct vs through the proxy, as a ratio.

Starts an SSE stub upstream (chat-completions shaped chunks), the recorder
(`python -m autotune record`) and, as a floor, a bare TCP relay (a process
that copies bytes both ways without reading HTTP: what any extra hop costs on
this machine) as subprocesses, then streams the same requests directly,
through the relay and through the proxy, interleaved, and prints a table of
medians.

    python scripts/bench_record.py [--requests 40] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import uvicorn
from rich.console import Console
from rich.table import Table
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

CHUNK = (
    'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,'
    '"delta":{"content":"word "},"finish_reason":null}]}\n\n'
)
USAGE = 'data: {"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":%d}}\n\n'


def stub_app() -> Starlette:
    """An upstream that streams ``max_tokens`` chunks, ``delay_s`` apart."""

    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        chunks, delay_s = int(body["max_tokens"]), float(body.get("delay_s", 0.0))

        async def events() -> AsyncIterator[bytes]:
            for _ in range(chunks):
                if delay_s:
                    await asyncio.sleep(delay_s)
                yield CHUNK.encode()
            yield (USAGE % chunks).encode() + b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health", health),
        ]
    )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(2**16):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _serve_tcp_relay(upstream_port: int, port: int) -> None:
    """Copy bytes between each client and a fresh upstream connection; no HTTP parsing."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> tuple[float, float]:
    start = time.perf_counter()
    first = None
    async with client.stream("POST", url, json=body) as response:
        async for _ in response.aiter_raw():
            if first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - start, end - start


async def _measure(
    urls: dict[str, str], body: dict[str, object], requests: int, concurrency: int
) -> dict[str, tuple[list[float], list[float]]]:
    results: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in urls}
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for name, url in urls.items():  # warm up connections
            await _one(client, url, body)
            results[name] = ([], [])
        for _ in range(requests // concurrency):
            for name, url in urls.items():  # interleave so drift hits both alike
                batch = await asyncio.gather(*(_one(client, url, body) for _ in range(concurrency)))
                for ttfb, total in batch:
                    results[name][0].append(ttfb)
                    results[name][1].append(total)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--serve-stub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-relay", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_stub:
        uvicorn.run(stub_app(), host="127.0.0.1", port=args.serve_stub, log_level="warning")
        return
    if args.serve_relay:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve_tcp_relay(*args.serve_relay))
        return

    stub_port, relay_port, proxy_port = _free_port(), _free_port(), _free_port()
    out = Path(tempfile.mkdtemp()) / "bench.jsonl"
    recorder_argv = [
        sys.executable, "-m", "autotune", "record",
        "--upstream", f"http://127.0.0.1:{stub_port}",
        "--listen", f"127.0.0.1:{proxy_port}", "--out", str(out),
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--serve-stub", str(stub_port)], start_new_session=True
        ),
        subprocess.Popen(recorder_argv, stdout=subprocess.DEVNULL, start_new_session=True),
        subprocess.Popen(
            [sys.executable, __file__, "--serve-relay", str(stub_port), str(relay_port)],
            start_new_session=True,
        ),
    ]
    try:
        _wait_healthy(f"http://127.0.0.1:{stub_port}/health")
        _wait_healthy(f"http://127.0.0.1:{proxy_port}/health")
        _wait_healthy(f"http://127.0.0.1:{relay_port}/health")
        urls = {
            "direct": f"http://127.0.0.1:{stub_port}/v1/chat/completions",
            "relay": f"http://127.0.0.1:{relay_port}/v1/chat/completions",
            "proxy": f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
        }
        scenarios = {
            "paced 64 chunks x 5 ms": {"max_tokens": 64, "delay_s": 0.005},
            "burst 2,000 chunks": {"max_tokens": 2000, "delay_s": 0.0},
            "paced, 200 KB prompt": {
                "max_tokens": 64,
                "delay_s": 0.005,
                "messages": [{"role": "user", "content": "word " * 40_000}],
            },
        }
        table = Table(title=f"autotune record overhead ({args.concurrency} concurrent streams)")
        for column in ("scenario", "metric"):
            table.add_column(column)
        columns = ("direct ms", "TCP relay ms", "proxy ms", "proxy - direct ms", "proxy / direct")
        for column in columns:
            table.add_column(column, justify="right")
        for label, extra in scenarios.items():
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            body.update(extra)
            results = asyncio.run(_measure(urls, body, args.requests, args.concurrency))
            for index, metric in enumerate(("first byte p50", "whole stream p50")):
                direct, relay, proxy = (
                    statistics.median(results[name][index]) * 1000 for name in urls
                )
                table.add_row(
                    label,
                    metric,
                    f"{direct:.2f}",
                    f"{relay:.2f}",
                    f"{proxy:.2f}",
                    f"{proxy - direct:+.2f}",
                    f"{proxy / direct:.3f}",
                )
        Console(width=140).print(table)
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGINT)
        for proc in procs:
            proc.wait(timeout=15)
    lines = out.read_text().splitlines() if out.exists() else []
    print(f"recorded {len(lines) - 1 if lines else 0} requests into {out}")
    print(json.dumps({"recorded_file_bytes": out.stat().st_size if out.exists() else 0}))


if __name__ == "__main__":
    main()
