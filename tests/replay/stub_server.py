"""A small vLLM look-alike for replay tests: fixed TTFT and inter-token delay, real SSE, /metrics.

Run: ``python -m tests.replay.stub_server --port P [--ttft-s S] [--itl-s S] [--max-running N]
[--api-key K]`` (OpenAI endpoints then answer 401 without ``Authorization: Bearer K``).
Requests beyond ``--max-running`` wait (``vllm:num_requests_waiting``), as vLLM queues them.
``--endless-line``: every OpenAI stream is one SSE line that never ends (a broken proxy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "stub-model"


def build_app(
    *,
    ttft_s: float,
    itl_s: float,
    max_running: int,
    api_key: str | None = None,
    endless_line: bool = False,
) -> Starlette:
    registry = CollectorRegistry()
    labels = {"model_name": MODEL, "engine": "0"}
    generation = Counter("vllm:generation_tokens", "", list(labels), registry=registry)
    prompt = Counter("vllm:prompt_tokens", "", list(labels), registry=registry)
    running = Gauge("vllm:num_requests_running", "", list(labels), registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "", list(labels), registry=registry)
    slots = asyncio.Semaphore(max_running)

    async def tokens(n: int, prompt_tokens: int) -> AsyncIterator[int]:
        waiting.labels(**labels).inc()
        async with slots:
            waiting.labels(**labels).dec()
            running.labels(**labels).inc()
            prompt.labels(**labels).inc(prompt_tokens)
            try:
                await asyncio.sleep(ttft_s)
                for i in range(n):
                    if i:
                        await asyncio.sleep(itl_s)
                    generation.labels(**labels).inc()
                    yield i
            finally:
                running.labels(**labels).dec()

    def sse(data: object) -> bytes:
        return f"data: {json.dumps(data)}\n\n".encode()

    def refused(request: Request) -> Response | None:
        if api_key is None or request.headers.get("authorization") == f"Bearer {api_key}":
            return None
        return JSONResponse({"error": "Unauthorized"}, status_code=401)

    async def openai(request: Request) -> Response:
        if (refusal := refused(request)) is not None:
            return refusal
        body = await request.json()
        n = int(body["max_tokens"])
        text = body.get("prompt") or " ".join(m["content"] for m in body["messages"])
        prompt_tokens = len(text.split())
        chat = "messages" in body

        async def endless() -> AsyncIterator[bytes]:
            yield b'data: {"choices": [{"delta": {"content": "'
            while True:
                yield b"A" * 65536
                await asyncio.sleep(0)

        async def stream() -> AsyncIterator[bytes]:
            async for i in tokens(n, prompt_tokens):
                last = i == n - 1
                choice = {"index": 0, "finish_reason": "length" if last else None}
                if chat:
                    choice["delta"] = {"content": "tok "}
                else:
                    choice["text"] = "tok "
                yield sse({"id": "x", "choices": [choice], "usage": None})
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n}
            yield sse({"id": "x", "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"

        body_stream = endless() if endless_line else stream()
        return StreamingResponse(body_stream, media_type="text/event-stream")

    async def messages(request: Request) -> Response:
        body = await request.json()
        n = int(body["max_tokens"])
        prompt_tokens = len(" ".join(m["content"] for m in body["messages"]).split())

        async def stream() -> AsyncIterator[bytes]:
            start = {"type": "message_start", "message": {"usage": {"input_tokens": prompt_tokens}}}
            yield b"event: message_start\n" + sse(start)
            async for _ in tokens(n, prompt_tokens):
                delta = {"type": "content_block_delta", "delta": {"text": "tok "}}
                yield b"event: content_block_delta\n" + sse(delta)
            end = {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}}
            yield b"event: message_delta\n" + sse({**end, "usage": {"output_tokens": n}})
            yield b"event: message_stop\n" + sse({"type": "message_stop"})

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", openai, methods=["POST"]),
            Route("/v1/completions", openai, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/models", models),
            Route("/metrics", metrics),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-s", type=float, default=0.02)
    parser.add_argument("--itl-s", type=float, default=0.002)
    parser.add_argument("--max-running", type=int, default=1000)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--endless-line", action="store_true")
    args = parser.parse_args()
    app = build_app(
        ttft_s=args.ttft_s,
        itl_s=args.itl_s,
        max_running=args.max_running,
        api_key=args.api_key,
        endless_line=args.endless_line,
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
