"""How fast our replay client streams, against an aiohttp client written as `vllm bench serve`'s.

A zero-latency SSE server (a raw asyncio server in its own process, pinned to
another core) answers every POST /v1/chat/completions with ``--chunks``
chat.completion.chunk events, a usage event and [DONE], as fast as it can
write them; other paths (the replay's /tokenize probe) get 404. The client
process is pinned to one core. Each round runs our ``replay`` (concurrency
mode) and then the baseline, ``--rounds`` times alternating; the table shows
the median of each. TTFT timing error = the client's first-token time minus
the server's own timestamp of writing that first chunk (same monotonic clock),
measured at one request in flight (``light``) and under the full load.

    python scripts/bench_replay.py [--requests 600] [--concurrency 32] [--chunks 100] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp
import httpx
from rich.console import Console
from rich.table import Table

from autotune.http_transport import AiohttpTransport
from autotune.replay.client import send_request
from autotune.replay.load import LoadSpec
from autotune.replay.runner import replay
from autotune.workload.plan import Message, PlannedRequest, WorkloadPlan

CLIENT_CORE = 0
SERVER_CORE = 1


# --- the zero-latency server (runs in a child process: `bench_replay.py --serve PORT N`) ---


class _SseProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive; each POST gets N SSE events in chunked encoding, no delay."""

    def __init__(self, chunks: int, stamps: dict[str, float]) -> None:
        self._chunks = chunks
        self._stamps = stamps
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._response: bytes | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream server's transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self._buffer[:head_end].decode("latin-1").lower()
            length = 0
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            if len(self._buffer) < head_end + 4 + length:
                return
            body = self._buffer[head_end + 4 : head_end + 4 + length]
            self._buffer = self._buffer[head_end + 4 + length :]
            self._answer(head, body)

    @staticmethod
    def _event(payload: bytes) -> bytes:
        event = b"data: " + payload + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(event), event)

    def _body(self) -> bytes:
        """The whole chunked SSE body, built once: the server spends next to nothing."""
        token = (
            b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,'
            b'"model":"bench","choices":[{"index":0,"delta":{"content":"tok"},'
            b'"logprobs":null,"finish_reason":%s}]}'
        )
        events = [self._event(token % b"null") for _ in range(self._chunks - 1)]
        events.append(self._event(token % b'"length"'))
        usage = {"prompt_tokens": 10, "completion_tokens": self._chunks, "total_tokens": 10}
        events.append(self._event(json.dumps({"id": "x", "choices": [], "usage": usage}).encode()))
        events.append(self._event(b"[DONE]"))
        events.append(b"0\r\n\r\n")
        return b"".join(events)

    def _answer(self, head: str, body: bytes) -> None:
        assert self._transport is not None
        if head.startswith("get /stamps"):
            payload = json.dumps(self._stamps).encode()
            self._stamps.clear()
            self._transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
            )
            return
        if not head.startswith("post /v1/chat/completions"):
            # e.g. the replay's POST /tokenize probe: answered as a server without it would.
            self._transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return
        request = json.loads(body)
        tag = request["messages"][-1]["content"]
        if self._response is None:
            self._response = (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + self._body()
            )
        self._stamps[tag] = time.perf_counter()
        self._transport.write(self._response)


def serve(port: int, chunks: int) -> None:
    os.sched_setaffinity(0, {SERVER_CORE % os.cpu_count()})  # type: ignore[operator]
    stamps: dict[str, float] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _SseProtocol(chunks, stamps), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --- the baseline: vLLM bench serve's aiohttp streaming loop, as it writes it ---


async def _baseline_request(
    session: aiohttp.ClientSession, url: str, payload: dict[str, object]
) -> tuple[float, float, float, int]:
    """(send, ttft, latency, output tokens); per-chunk timestamps and JSON parsing."""
    st = time.perf_counter()
    most_recent_timestamp = st
    ttft = 0.0
    itl: list[float] = []
    output_tokens = 0
    generated_text = ""
    async with session.post(url, json=payload) as response:
        async for chunk_bytes in response.content:
            chunk_bytes = chunk_bytes.strip()
            if not chunk_bytes:
                continue
            chunk = chunk_bytes.decode("utf-8").removeprefix("data: ")
            if chunk != "[DONE]":
                timestamp = time.perf_counter()
                data = json.loads(chunk)
                if choices := data.get("choices"):
                    content = choices[0]["delta"].get("content")
                    if ttft == 0.0:
                        ttft = timestamp - st
                    else:
                        itl.append(timestamp - most_recent_timestamp)
                    generated_text += content or ""
                elif usage := data.get("usage"):
                    output_tokens = usage.get("completion_tokens")
                most_recent_timestamp = timestamp
    return st, ttft, most_recent_timestamp - st, output_tokens


async def run_baseline(url: str, plan: WorkloadPlan, concurrency: int) -> list[tuple[str, float]]:
    semaphore = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    firsts: list[tuple[str, float]] = []
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(request: PlannedRequest) -> None:
            payload = {
                "model": "bench",
                "messages": [{"role": m.role, "content": m.text} for m in request.messages],
                "max_tokens": request.output_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            async with semaphore:
                st, ttft, _, _ = await _baseline_request(
                    session, f"{url}/v1/chat/completions", payload
                )
            firsts.append((request.messages[-1].text, st + ttft))

        await asyncio.gather(*(one(request) for request in plan.requests))
    return firsts


# --- measurement ---


@dataclass
class Sample:
    """One client's run: wall time and the CPU time its (pinned) process spent."""

    client: str
    wall_s: float
    cpu_s: float
    requests: int
    chunks: int

    @property
    def wall_rps(self) -> float:
        return self.requests / self.wall_s

    @property
    def rps(self) -> float:
        """Requests per second of client CPU: what the client sustains on its one core."""
        return self.requests / self.cpu_s

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.cpu_s


def make_plan(requests: int, chunks: int, tag: str) -> WorkloadPlan:
    planned = tuple(
        PlannedRequest(
            id=f"{tag}{i}",
            session=None,
            thread="main",
            after=(),
            gap_s=0.0,
            arrival_s=0.0,
            endpoint="openai.chat",
            system=None,
            messages=(Message("user", f"{tag}{i}"),),
            prompt_tokens=1,
            output_tokens=chunks,
            exact_output=False,
        )
        for i in range(requests)
    )
    return WorkloadPlan(name="bench", requests=planned, token_space="words", digest=tag)


async def stamps(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        return (await client.get(f"{url}/stamps")).json()


async def measure_ours(
    url: str,
    plan: WorkloadPlan,
    concurrency: int,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Sample:
    """Throughput through the whole replay path (runner, client, records, stats)."""
    load = LoadSpec(mode="concurrency", concurrency=concurrency)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = await replay(
        url=url, plan=plan, load=load, model_name="bench", scrape_interval_s=None,
        transport=transport,
    )  # fmt: skip
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    await stamps(url)  # clear them
    failed = sum(not record.ok for record in result.records)
    if failed:
        raise SystemExit(f"our client saw {failed} failed requests")
    chunks = sum(record.chunks for record in result.records)
    return Sample("ours", wall, cpu, len(result.records), chunks)


async def ttft_error_ours(url: str, plan: WorkloadPlan, concurrency: int) -> float:
    """Median of (our first-token time - the server's first-chunk write time), seconds."""
    semaphore = asyncio.Semaphore(concurrency)
    origin = time.perf_counter()
    firsts: dict[str, float] = {}
    transport = AiohttpTransport()
    async with httpx.AsyncClient(base_url=url, timeout=None, transport=transport) as client:

        async def one(request: PlannedRequest) -> None:
            async with semaphore:
                outcome = await send_request(client, request, model_name="bench", origin_s=origin)
            record = outcome.record
            firsts[request.messages[-1].text] = origin + record.send_s + (record.ttft_s or 0.0)

        await asyncio.gather(*(one(request) for request in plan.requests))
    server = await stamps(url)
    return statistics.median(at - server[tag] for tag, at in firsts.items())


async def measure_baseline(url: str, plan: WorkloadPlan, concurrency: int) -> tuple[Sample, float]:
    started, cpu_started = time.perf_counter(), time.process_time()
    firsts = await run_baseline(url, plan, concurrency)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    server = await stamps(url)
    errors = [at - server[tag] for tag, at in firsts if tag in server]
    chunks = len(firsts) * plan.requests[0].output_tokens
    return Sample("baseline", wall, cpu, len(firsts), chunks), statistics.median(errors)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def bench(args: argparse.Namespace, url: str) -> dict[str, float]:
    samples: dict[str, list[Sample]] = {"ours": [], "baseline": [], "httpcore": []}
    errors: dict[str, list[float]] = {
        "ours": [],
        "baseline": [],
        "ours_light": [],
        "baseline_light": [],
    }
    for round_ in range(args.rounds):
        plan = make_plan(args.requests, args.chunks, f"ours{round_}-")
        samples["ours"].append(await measure_ours(url, plan, args.concurrency))
        plan = make_plan(args.requests, args.chunks, f"baseline{round_}-")
        sample, error = await measure_baseline(url, plan, args.concurrency)
        samples["baseline"].append(sample)
        errors["baseline"].append(error)
        plan = make_plan(args.requests // 4, args.chunks, f"loaded{round_}-")
        errors["ours"].append(await ttft_error_ours(url, plan, args.concurrency))
        plan = make_plan(50, args.chunks, f"light{round_}-")
        errors["ours_light"].append(await ttft_error_ours(url, plan, 1))
        plan = make_plan(50, args.chunks, f"baselight{round_}-")
        errors["baseline_light"].append((await measure_baseline(url, plan, 1))[1])
        if args.with_httpcore:
            plan = make_plan(args.requests, args.chunks, f"httpcore{round_}-")
            transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=None))
            samples["httpcore"].append(
                await measure_ours(url, plan, args.concurrency, transport=transport)
            )
    ours, baseline = samples["ours"], samples["baseline"]
    extra = {}
    if samples["httpcore"]:
        extra["httpcore_rps"] = statistics.median(s.rps for s in samples["httpcore"])
        extra["httpcore_chunks_per_s"] = statistics.median(
            s.chunks_per_s for s in samples["httpcore"]
        )
        extra["httpcore_wall_rps"] = statistics.median(s.wall_rps for s in samples["httpcore"])
    return {
        **extra,
        "ours_chunks_per_s": statistics.median(s.chunks_per_s for s in ours),
        "ours_rps": statistics.median(s.rps for s in ours),
        "baseline_chunks_per_s": statistics.median(s.chunks_per_s for s in baseline),
        "baseline_rps": statistics.median(s.rps for s in baseline),
        # each round's ratio, then the median: rounds share the machine's load of the moment
        "ratio": statistics.median(o.rps / b.rps for o, b in zip(ours, baseline, strict=True)),
        "ours_wall_rps": statistics.median(s.wall_rps for s in ours),
        "baseline_wall_rps": statistics.median(s.wall_rps for s in baseline),
        "ttft_error_ms": statistics.median(errors["ours_light"]) * 1e3,
        "ttft_error_loaded_ms": statistics.median(errors["ours"]) * 1e3,
        "baseline_ttft_error_loaded_ms": statistics.median(errors["baseline"]) * 1e3,
        "baseline_ttft_error_ms": statistics.median(errors["baseline_light"]) * 1e3,
        "load_average": os.getloadavg()[0],
    }


def print_table(figures: dict[str, float], args: argparse.Namespace) -> None:
    table = Table(
        title=f"replay client: {args.requests} requests x {args.chunks} chunks, "
        f"{args.concurrency} in flight, client on one core, median of {args.rounds} rounds, "
        f"machine load average {figures['load_average']:.1f}"
    )
    columns = ("client", "requests/CPU-s", "chunks/CPU-s", "requests/s (wall)", "TTFT error ms")
    for column in columns:
        table.add_column(column, justify="right")
    table.add_row(
        "ours (replay: httpx API on AiohttpTransport)",
        f"{figures['ours_rps']:,.0f}", f"{figures['ours_chunks_per_s']:,.0f}",
        f"{figures['ours_wall_rps']:,.0f}",
        f"{figures['ttft_error_loaded_ms']:.2f} (1 in flight: {figures['ttft_error_ms']:.3f})",
    )  # fmt: skip
    table.add_row(
        "baseline (aiohttp, as vllm bench serve)",
        f"{figures['baseline_rps']:,.0f}", f"{figures['baseline_chunks_per_s']:,.0f}",
        f"{figures['baseline_wall_rps']:,.0f}",
        f"{figures['baseline_ttft_error_loaded_ms']:.2f} "
        f"(1 in flight: {figures['baseline_ttft_error_ms']:.3f})",
    )  # fmt: skip
    if "httpcore_rps" in figures:
        table.add_row(
            "ours on httpx's default transport (httpcore + h11)",
            f"{figures['httpcore_rps']:,.0f}", f"{figures['httpcore_chunks_per_s']:,.0f}",
            f"{figures['httpcore_wall_rps']:,.0f}", "",
        )  # fmt: skip
    table.add_row("ratio ours / baseline", f"{figures['ratio']:.2f}x", "", "", "")
    Console(width=130).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--with-httpcore", action="store_true", help="also time our client on httpx's own transport"
    )
    parser.add_argument(
        "--serve", nargs=2, type=int, metavar=("PORT", "CHUNKS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), str(args.chunks)])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("bench server did not start") from None
                time.sleep(0.05)
        os.sched_setaffinity(0, {CLIENT_CORE})
        figures = asyncio.run(bench(args, url))
    finally:
        server.terminate()
        server.wait(timeout=5)
    if args.json:
        print(json.dumps({key: round(value, 3) for key, value in figures.items()}))
    else:
        print_table(figures, args)


if __name__ == "__main__":
    main()
