"""Request bodies and headers for each endpoint a PlannedRequest may target.

Exact output lengths: the OpenAI endpoints get ``max_tokens = min_tokens = N``
and ``ignore_eos``; vLLM's Anthropic endpoint has no ``ignore_eos``, so it
gets ``max_tokens`` only. Streams always ask for usage so output tokens come
from the server's own count.
"""

from __future__ import annotations

import json
from typing import Any

from autotune.workload.plan import Endpoint, Message, PlannedRequest

ENDPOINT_PATHS: dict[Endpoint, str] = {
    "openai.chat": "/v1/chat/completions",
    "openai.completions": "/v1/completions",
    "anthropic.messages": "/v1/messages",
}
ANTHROPIC_VERSION = "2023-06-01"


def _salted(text: str, salt: str | None) -> str:
    # A salt at the very start changes the first KV block, so a recycled
    # session cannot hit the prefix cache left by its earlier run.
    return f"[{salt}] {text}" if salt else text


def render_prompt(system: str | None, messages: tuple[Message, ...]) -> str:
    """A chat rendered as one completion prompt: system first, turns separated by blank lines."""
    parts = [system] if system else []
    parts.extend(f"{message.role}: {message.text}" for message in messages)
    return "\n\n".join(parts)


def _openai_chat(request: PlannedRequest, salt: str | None) -> dict[str, Any]:
    messages: list[dict[str, str]] = []
    if request.system is not None:
        messages.append({"role": "system", "content": request.system})
    messages.extend({"role": m.role, "content": m.text} for m in request.messages)
    if salt and messages:
        messages[0] = {**messages[0], "content": _salted(messages[0]["content"], salt)}
    return {"messages": messages}


def _anthropic(request: PlannedRequest, salt: str | None) -> dict[str, Any]:
    # Anthropic takes system text apart from the turns; system turns join it.
    system_parts = [request.system] if request.system is not None else []
    system_parts.extend(m.text for m in request.messages if m.role == "system")
    turns = [{"role": m.role, "content": m.text} for m in request.messages if m.role != "system"]
    body: dict[str, Any] = {"messages": turns}
    system = "\n\n".join(system_parts)
    if system:
        body["system"] = _salted(system, salt)
    elif salt and turns:
        turns[0] = {**turns[0], "content": _salted(turns[0]["content"], salt)}
    return body


def request_body(request: PlannedRequest, *, model_name: str, salt: str | None = None) -> bytes:
    """The JSON body for ``request``, streaming, usage included."""
    body: dict[str, Any]
    if request.endpoint == "anthropic.messages":
        body = _anthropic(request, salt)
        body.update(model=model_name, max_tokens=request.output_tokens, stream=True)
        return json.dumps(body).encode()
    if request.endpoint == "openai.chat":
        body = _openai_chat(request, salt)
    else:
        body = {"prompt": _salted(render_prompt(request.system, request.messages), salt)}
    body.update(
        model=model_name,
        max_tokens=request.output_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    if request.exact_output:
        body.update(min_tokens=request.output_tokens, ignore_eos=True)
    return json.dumps(body).encode()


def request_headers(endpoint: Endpoint, api_key: str | None) -> dict[str, str]:
    """Content type, auth (never logged) and, for Anthropic, its version header."""
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    if endpoint == "anthropic.messages":
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if api_key:
            headers["x-api-key"] = api_key
    return headers
