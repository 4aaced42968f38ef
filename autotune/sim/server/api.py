"""The simulator's HTTP routes: vLLM's OpenAI and Anthropic endpoints, health, metrics.

Requests are validated, tokenized and queued as ``RequestStream``s on the
``EngineRunner``; ``autotune.sim.server.sse`` writes what comes back. ``/autotune/lockstep``
lets a replay client hold the engine's clock (``sim/server/lockstep.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from autotune.errors import InputError
from autotune.replay.lockstep_wire import AT_HEADER, LOCKSTEP_PATH, SEQ_HEADER
from autotune.sim.model.prompt import PromptRenderer
from autotune.sim.server import responses as shapes
from autotune.sim.server.faults import FaultInjector
from autotune.sim.server.flags import ServeArgs
from autotune.sim.server.lockstep import ClockedArrival
from autotune.sim.server.metrics_export import CONTENT_TYPE, VllmMetrics
from autotune.sim.server.scaled_time_loop import EngineDeadError, EngineRunner
from autotune.sim.server.sse import SseResponse, StreamWriter, wait_disconnect
from autotune.workload.chat_tools import system_with_tools
from autotune.workload.hf_tokenizer import load_tokenizer
from autotune.workload.plan import Message

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's --api-key middleware
# The prompt renderer remembers every message it has tokenized (sessions resend their
# history); a fresh one every this many requests bounds that memory in long runs.
RENDERER_REQUESTS = 20_000


def _content_text(content: Any) -> str:
    """Message content as plain text: a string, or OpenAI / Anthropic content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            parts.append(str(part))
        elif isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif "input" in part:  # Anthropic tool_use
            parts.append(json.dumps(part["input"]))
        elif "content" in part:  # Anthropic tool_result
            parts.append(_content_text(part["content"]))
    return "\n".join(parts)


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class SimApi:
    """The route handlers over one runner."""

    def __init__(
        self,
        args: ServeArgs,
        runner: EngineRunner,
        metrics: VllmMetrics,
        faults: FaultInjector,
        *,
        max_model_len: int,
        on_startup: Callable[[], None],
    ) -> None:
        self.args = args
        self.runner = runner
        self.metrics = metrics
        self.faults = faults
        self.max_model_len = max_model_len
        self.model_name = args.served_model_name
        # The served model's own tokenizer when given (counts as vLLM would), else the estimate.
        self.tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
        self.renderer = PromptRenderer(self.tokenizer)
        self._rendered = 0
        self._on_startup = on_startup
        self._created = int(time.time())

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/ping", self.health, methods=["GET", "POST"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/load", self.load, methods=["GET"]),
            Route("/metrics", self.metrics_text, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route(LOCKSTEP_PATH, self.lockstep, methods=["POST", "DELETE"]),
            Route(f"{LOCKSTEP_PATH}/advance", self.lockstep_advance, methods=["POST"]),
        ]
        if self.args.dev_mode:
            routes.append(Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]))
        app = Starlette(routes=routes, lifespan=self._lifespan)
        app.add_middleware(_ApiKeyMiddleware, keys=self.args.api_keys)  # type: ignore[arg-type]
        return app

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._on_startup()
        yield

    # -- plain endpoints ------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=503 if self.runner.dead else 200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": self.args.vllm_version})

    async def reset_prefix_cache(self, request: Request) -> Response:
        """vLLM's dev-mode cache reset (its benchmarks call it between runs)."""
        self.runner.core.reset_prefix_cache()
        return Response(status_code=200)

    async def load(self, request: Request) -> Response:
        return JSONResponse({"server_load": 0})

    async def metrics_text(self, request: Request) -> Response:
        if self.args.disable_log_stats:  # vLLM drops its vllm:* stat loggers too
            return Response(b"", media_type=CONTENT_TYPE)
        self.metrics.sync(self.runner.core.counters)
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": self.args.sim.model,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [],
        }
        return JSONResponse({"object": "list", "data": [card]})

    # -- lockstep (the replay client holds the clock) ---------------------------------------

    async def lockstep(self, request: Request) -> Response:
        """POST: the client takes the engine's clock (``{"now_s"}``); DELETE: gives it back."""
        if request.method == "DELETE":
            self.runner.stop_lockstep()
            return Response(status_code=204)
        return JSONResponse({"now_s": self.runner.start_lockstep()})

    async def lockstep_advance(self, request: Request) -> Response:
        """``{"until_s", "sent", "cancel"}`` -> ``{"now_s", "ended", "dead"}`` once it holds."""
        try:
            body = json.loads(await request.body())
            until_s = body["until_s"]
            until_s = None if until_s is None else float(until_s)
            sent = int(body["sent"])
            cancel = tuple(int(seq) for seq in body.get("cancel", ()))
        except (ValueError, TypeError, KeyError) as exc:
            return JSONResponse({"error": f"bad lockstep advance: {exc}"}, status_code=400)
        lock = await self.runner.advance(until_s, sent=sent, cancel=cancel)
        if lock is None:
            return JSONResponse({"error": "not in lockstep"}, status_code=409)
        return JSONResponse(
            {"now_s": self.runner.core.clock_s, "ended": lock.ended, "dead": self.runner.dead}
        )

    def _clocked(self, request: Request) -> ClockedArrival | None:
        """A lockstep client's send time and place, when it is in lockstep and says them."""
        at, seq = request.headers.get(AT_HEADER), request.headers.get(SEQ_HEADER)
        if self.runner.lockstep is None or at is None or seq is None:
            return None
        try:
            return ClockedArrival(at_s=float(at), seq=int(seq))
        except ValueError as exc:
            self.runner.arrived_without_engine(ClockedArrival(at_s=0.0, seq=-1))  # still counts
            raise BadRequest(f"bad {AT_HEADER} / {SEQ_HEADER} header: {exc}") from exc

    # -- generation endpoints -------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "openai.chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "openai.completions")

    async def messages(self, request: Request) -> Response:
        return await self._generate(request, "anthropic.messages")

    async def count_tokens(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            ids = self._prompt_ids(body, "anthropic.messages")
        except BadRequest as exc:
            return JSONResponse(shapes.anthropic_error(str(exc)), status_code=exc.status)
        count = len(ids)
        return JSONResponse(
            {"input_tokens": count, "context_management": {"original_input_tokens": count}}
        )

    async def tokenize(self, request: Request) -> Response:
        """vLLM's /tokenize: ``{"prompt"}`` or ``{"messages"}`` -> the token ids."""
        try:
            body = await self._body(request)
            endpoint = "openai.chat" if "messages" in body else "openai.completions"
            ids = self._prompt_ids(body, endpoint)
        except BadRequest as exc:
            return JSONResponse(shapes.openai_error(str(exc), exc.status, exc.kind), exc.status)
        return JSONResponse({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids})

    async def _body(self, request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError as exc:
            raise BadRequest(f"Invalid JSON body: {exc.msg}") from exc
        if not isinstance(body, dict):
            raise BadRequest("The request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        return body

    def _prompt_ids(self, body: dict[str, Any], endpoint: str) -> list[int]:
        self._rendered += 1
        if self._rendered % RENDERER_REQUESTS == 0:
            self.renderer = PromptRenderer(self.tokenizer)
        if endpoint == "openai.completions":
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
                return list(prompt)
            if isinstance(prompt, list):
                prompt = "".join(str(part) for part in prompt)
            if not isinstance(prompt, str):
                raise BadRequest("'prompt' must be a string or a list of token ids")
            return self.renderer.text_ids(prompt)
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise BadRequest("messages must contain at least one item")
        messages = [
            Message(role=str(m.get("role", "user")), text=_content_text(m.get("content")))
            for m in raw
            if isinstance(m, dict)
        ]
        tools = body.get("tools")
        if endpoint != "anthropic.messages":
            if messages[0].role == "system":
                first = system_with_tools(messages[0].text, tools) or ""
                messages[0] = Message(role="system", text=first)
            elif (block := system_with_tools(None, tools)) is not None:
                messages.insert(0, Message(role="system", text=block))
            return self.renderer.render(None, messages, endpoint)  # type: ignore[arg-type]
        # The Anthropic face folds system turns into the system text; the tools follow it.
        parts = [_content_text(body["system"])] if body.get("system") is not None else []
        parts += [m.text for m in messages if m.role == "system"]
        turns = [m for m in messages if m.role != "system"]
        system = system_with_tools("\n\n".join(parts) or None, tools)
        return self.renderer.render(system, turns, endpoint)  # type: ignore[arg-type]

    def _max_tokens(self, body: dict[str, Any], prompt_tokens: int) -> int:
        if prompt_tokens >= self.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your prompt contains {prompt_tokens} input tokens, which exceeds this limit "
                "even without any output tokens. Please reduce the length of the input prompt."
            )
        room = self.max_model_len - prompt_tokens
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        if requested is None:
            return room
        if not isinstance(requested, int) or requested < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {requested}.")
        if requested > room:
            raise BadRequest(
                f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This "
                f"model's maximum context length is {self.max_model_len} tokens and your request "
                f"has {prompt_tokens} input tokens ({requested} > {self.max_model_len} - "
                f"{prompt_tokens})."
            )
        return requested

    async def _generate(self, request: Request, endpoint: str) -> Response:
        received_wall_s = self.runner.wall_now()
        anthropic = endpoint == "anthropic.messages"
        clocked: ClockedArrival | None = None
        try:
            clocked = self._clocked(request)
            body = await self._body(request)
            if self.runner.dead:
                raise BadRequest(shapes.ENGINE_DEAD_MESSAGE, 500, "InternalServerError")
            if self.faults.config.never_stream:
                self.runner.arrived_without_engine(clocked, ended=False)
                await asyncio.Event().wait()  # /health is fine, this answer never comes
            if self.faults.should_fail_with_5xx():
                raise BadRequest("Simulated server error.", 500, "InternalServerError")
            if body.get("n", 1) != 1:
                raise BadRequest("The simulator serves n=1 only (one choice per request).")
            ids = self._prompt_ids(body, endpoint)
            max_tokens = self._max_tokens(body, len(ids))
            min_tokens = body.get("min_tokens") or 0
            if not isinstance(min_tokens, int) or min_tokens < 0:
                raise BadRequest(f"min_tokens must be a non-negative integer, got {min_tokens!r}.")
            salt = body.get("cache_salt")
            if salt is not None and not isinstance(salt, str):
                raise BadRequest(f"cache_salt must be a string, got {salt!r}.")
            stream = self.runner.submit(
                ids,
                max_tokens=max_tokens,
                min_tokens=min(min_tokens, max_tokens),
                ignore_eos=bool(body.get("ignore_eos", False)),
                cache_salt=salt,
                received_wall_s=received_wall_s,
                clocked=clocked,
            )
        except BadRequest as exc:
            self.runner.arrived_without_engine(clocked)
            if anthropic:
                kind = "api_error" if exc.status >= 500 else "invalid_request_error"
                return JSONResponse(shapes.anthropic_error(str(exc), kind), exc.status)
            return JSONResponse(shapes.openai_error(str(exc), exc.status, exc.kind), exc.status)
        except InputError as exc:  # the engine rejected the prompt
            self.runner.arrived_without_engine(clocked)
            if anthropic:
                return JSONResponse(shapes.anthropic_error(str(exc)), 400)
            return JSONResponse(shapes.openai_error(str(exc), 400, "BadRequestError"), 400)
        except EngineDeadError:
            self.runner.arrived_without_engine(clocked)
            return JSONResponse(
                shapes.openai_error(shapes.ENGINE_DEAD_MESSAGE, 500, "InternalServerError"), 500
            )
        writer = StreamWriter(
            stream,
            endpoint,
            body,
            model_name=self.model_name,
            faults=self.faults,
            time_scale=self.runner.time_scale,
        )
        if body.get("stream"):
            return SseResponse(writer.events(), lambda: self.runner.abort(stream))  # type: ignore[return-value]
        waiter = asyncio.ensure_future(writer.collect())
        watcher = asyncio.ensure_future(wait_disconnect(request.receive))
        try:
            await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not waiter.done():
                waiter.cancel()
                self.runner.abort(stream)
        if waiter.cancelled():
            return Response(status_code=499)
        try:
            return JSONResponse(waiter.result())
        except EngineDeadError:
            return JSONResponse(
                shapes.openai_error(shapes.ENGINE_DEAD_MESSAGE, 500, "InternalServerError"), 500
            )


class _ApiKeyMiddleware:
    """vLLM's --api-key check: ``Authorization: Bearer <key>`` on /v1 (and similar) paths."""

    def __init__(self, app: Any, keys: tuple[str, ...]) -> None:
        self.app = app
        self.expected = {f"Bearer {key}".encode() for key in keys}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.expected
            and scope["type"] == "http"
            and scope["path"].startswith(GUARDED_PREFIXES)
            and dict(scope["headers"]).get(b"authorization") not in self.expected
        ):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)
