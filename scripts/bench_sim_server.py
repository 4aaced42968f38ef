"""How faithfully the simulator *server* keeps modelled time, and how fast it streams.

For each (concurrency, time scale) it launches ``python -m autotune.sim serve``
on the field notes' setup (Qwen3.6-27B AWQ on the RTX 4080 Super, 9 GiB fp8
KV), runs a closed loop with a bare asyncio HTTP client (N clients, each
sending its next request when the previous ends), and converts wall figures
to modelled ones (throughput / scale, latency x scale). The baseline is the
same closed loop predicted in-process by ``autotune.sim.virtual.sweep`` (no HTTP, no
wall clock): ratio 1.00 means the server adds nothing.

It also measures the raw streaming rate: SSE chunks per wall second through
one process at a time scale so high that the engine never sleeps.

    python scripts/bench_sim_server.py [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from autotune.sim.virtual.sweep import baseline_config, closed_loop_sweep

REPO = Path(__file__).resolve().parents[1]
HARDWARE, MODEL = "rtx4080s-32g", "qwen3.6-27b-awq"
FLAGS = ["--language-model-only", "--kv-cache-memory-bytes", "9G", "--kv-cache-dtype", "fp8_e4m3"]
PROMPT_TOKENS, OUTPUT_TOKENS, REQUESTS_PER_CLIENT = 128, 128, 2
CELLS = [(1, 20), (1, 50), (8, 20), (8, 50), (32, 20), (32, 50)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, *flags: str, model: str = MODEL, hardware: str = HARDWARE) -> None:
        self.port = _free_port()
        argv = [sys.executable, "-m", "autotune.sim", "serve", model, "--hardware", hardware,
                "--port", str(self.port), "--startup-s", "0.5", *flags]  # fmt: skip
        self.process = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health").status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("simulator server did not start")

    def __exit__(self, *exc: object) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _request(index: int, tokens: int) -> bytes:
    words = " ".join(f"c{index}w{i}" for i in range(PROMPT_TOKENS))
    body = json.dumps({"messages": [{"role": "user", "content": words}], "max_tokens": tokens,
                       "min_tokens": tokens, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\nconnection: close\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )


async def _stream(port: int, request: bytes) -> tuple[int, int]:
    """One streamed request: (completion tokens, SSE chunks received)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    data = b""
    while b"data: [DONE]" not in data[-64:]:
        chunk = await reader.read(1 << 16)
        if not chunk:
            break
        data += chunk
    writer.close()
    usage = next(line for line in data.split(b"\n") if b'"usage"' in line)
    tokens = json.loads(usage[len(b"data: ") :])["usage"]["completion_tokens"]
    return tokens, data.count(b"data: ") - 2


async def _closed_loop(port: int, clients: int) -> tuple[float, float, int, float]:
    """(output tok/s, mean E2E s, total chunks, wall s), all wall-clock."""
    latencies: list[float] = []
    totals = [0, 0]

    async def client(index: int) -> None:
        for turn in range(REQUESTS_PER_CLIENT):
            sent = time.perf_counter()
            tokens, chunks = await _stream(port, _request(index * 100 + turn, OUTPUT_TOKENS))
            latencies.append(time.perf_counter() - sent)
            totals[0] += tokens
            totals[1] += chunks

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall_s = time.perf_counter() - started
    return totals[0] / wall_s, sum(latencies) / len(latencies), totals[1], wall_s


def fidelity_rows() -> list[dict[str, float]]:
    base = baseline_config(HARDWARE, MODEL)
    predicted = {
        row.concurrency: row
        for row in closed_loop_sweep(
            base, concurrencies=sorted({c for c, _ in CELLS}), mtps=[0],
            prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS,
            requests_per_client=REQUESTS_PER_CLIENT,
        )
    }  # fmt: skip
    rows = []
    for clients, scale in CELLS:
        with Server(*FLAGS, "--time-scale", str(scale)) as server:
            tput, latency, chunks, wall_s = asyncio.run(_closed_loop(server.port, clients))
        base_row = predicted[clients]
        rows.append({
            "concurrency": clients, "time_scale": scale,
            "server_tok_s": tput / scale, "predicted_tok_s": base_row.output_tokens_per_s,
            "throughput_ratio": tput / scale / base_row.output_tokens_per_s,
            "server_latency_s": latency * scale, "predicted_latency_s": base_row.mean_latency_s,
            "latency_ratio": latency * scale / base_row.mean_latency_s,
            "chunks_per_token": chunks / (clients * REQUESTS_PER_CLIENT * OUTPUT_TOKENS),
            "wall_s": wall_s,
        })  # fmt: skip
    return rows


def streaming_rate() -> dict[str, float]:
    """Streamed tokens per wall second, one stream and 16 at once, engine never sleeping."""
    out = {}
    with Server("--time-scale", "100000", model="llama-3.1-8b", hardware="h100-80g") as server:
        for clients in (1, 16):

            async def run(n: int = clients) -> tuple[int, int, float]:
                started = time.perf_counter()
                results = await asyncio.gather(
                    *(_stream(server.port, _request(i, 2000)) for i in range(n))
                )
                wall_s = time.perf_counter() - started
                return sum(t for t, _ in results), sum(c for _, c in results), wall_s

            tokens, chunks, wall_s = asyncio.run(run())
            out[f"tokens_per_s_{clients}_streams"] = tokens / wall_s
            out[f"chunks_per_s_{clients}_streams"] = chunks / wall_s
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = fidelity_rows()
    rate = streaming_rate()
    if args.json:
        print(json.dumps({"fidelity": rows, "streaming": rate}))
        return
    table = Table(title=f"Sim server vs in-process prediction ({MODEL} on {HARDWARE}, "
                  f"{OUTPUT_TOKENS} output tokens, closed loop)")  # fmt: skip
    for column in (
        "clients",
        "scale",
        "server tok/s",
        "predicted tok/s",
        "ratio",
        "server E2E s",
        "predicted E2E s",
        "ratio",
        "chunks/token",
        "wall s",
    ):
        table.add_column(column, justify="right")  # fmt: skip
    for r in rows:
        table.add_row(
            str(r["concurrency"]), str(r["time_scale"]), f"{r['server_tok_s']:.1f}",
            f"{r['predicted_tok_s']:.1f}", f"{r['throughput_ratio']:.2f}",
            f"{r['server_latency_s']:.2f}", f"{r['predicted_latency_s']:.2f}",
            f"{r['latency_ratio']:.2f}", f"{r['chunks_per_token']:.2f}", f"{r['wall_s']:.1f}",
        )  # fmt: skip
    console = Console()
    console.print(table)
    for name, value in rate.items():
        console.print(f"{name}: {value:,.0f}")


if __name__ == "__main__":
    main()
