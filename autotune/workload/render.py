"""Render OpenAI / Anthropic request bodies to plain text messages.

The workload format holds plain-text messages: tool calls, tool results and
thinking blocks become text; tool definitions become part of the system text,
as the served model's chat template writes them (``autotune.workload.chat_tools``).
Claude Code's per-request attribution block (``x-anthropic-billing-header``)
is dropped from the system prompt, since it would defeat prefix caching; the
call says it was there (``billing_header``), so the recorder can tell the user
that their live traffic misses the cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from autotune.workload.chat_tools import system_with_tools
from autotune.workload.plan import Endpoint

BILLING_HEADER_PREFIX = "x-anthropic-billing-header"


@dataclass(frozen=True)
class RenderedCall:
    """A request body as plain text: system (with tools) and (role, text) messages."""

    endpoint: Endpoint
    system: str | None
    messages: tuple[tuple[str, str], ...]
    max_tokens: int | None
    billing_header: bool = False  # the client sent (and we dropped) a billing block


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _block_text(block: Any) -> str:
    if isinstance(block, str):
        return block
    if not isinstance(block, dict):
        return _json(block)
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("thinking", "redacted_thinking"):
        return str(block.get("thinking") or block.get("data") or "")
    if kind == "tool_use":
        return _json({"tool_use": block.get("name"), "input": block.get("input")})
    if kind == "tool_result":
        return _content_text(block.get("content"))
    if kind in ("image", "image_url", "document"):
        return f"[{kind}]"
    return _json(block)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_block_text(block) for block in content)
    return _block_text(content)


def _role(role: Any) -> str:
    if role == "assistant":
        return "assistant"
    if role in ("system", "developer"):
        return "system"
    return "user"  # user, tool, function, and Claude Code's ctx / msg roles


def _strip_billing_header(parts: list[str]) -> tuple[list[str], bool]:
    """System parts without Claude Code's billing block (a part, or a part's first line)."""
    kept: list[str] = []
    found = False
    for part in parts:
        if part.startswith(BILLING_HEADER_PREFIX):
            found = True
            part = part.partition("\n")[2]
        if part:
            kept.append(part)
    return kept, found


def _system_text(parts: list[str], tools: Any) -> str | None:
    text = "\n".join(part for part in parts if part)
    return system_with_tools(text or None, tools)


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def render_anthropic(body: dict[str, Any]) -> RenderedCall:
    """A /v1/messages body."""
    system = body.get("system")
    blocks = system if isinstance(system, list) else [system] if system else []
    parts, billing = _strip_billing_header([_block_text(block) for block in blocks])
    turns = [
        (_role(message.get("role")), _content_text(message.get("content")))
        for message in body.get("messages") or []
        if isinstance(message, dict)
    ]
    # As vLLM's Anthropic face: system turns join the system text, and the tools follow it.
    folded = ["\n".join(part for part in parts if part)]
    folded += [text for role, text in turns if role == "system"]
    system = system_with_tools(
        "\n\n".join(part for part in folded if part) or None, body.get("tools")
    )
    messages = tuple((role, text) for role, text in turns if role != "system")
    return RenderedCall("anthropic.messages", system, messages, _max_tokens(body), billing)


def _openai_message_text(message: dict[str, Any]) -> str:
    text = _content_text(message.get("content"))
    calls = message.get("tool_calls")
    if calls:
        text = "\n".join(part for part in (text, _json(calls)) if part)
    return text


def render_openai_chat(body: dict[str, Any]) -> RenderedCall:
    """A /v1/chat/completions body; leading system / developer messages form the system."""
    raw = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    system_parts: list[str] = []
    while raw and _role(raw[0].get("role")) == "system":
        system_parts.append(_content_text(raw.pop(0).get("content")))
    messages = tuple((_role(m.get("role")), _openai_message_text(m)) for m in raw)
    system_parts, billing = _strip_billing_header(system_parts)  # Claude Code via a shim
    system = _system_text(system_parts, body.get("tools"))
    return RenderedCall("openai.chat", system, messages, _max_tokens(body), billing)


def render_openai_completion(body: dict[str, Any]) -> RenderedCall:
    """A /v1/completions body: the prompt becomes one user message."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "\n".join(str(item) for item in prompt)
    return RenderedCall(
        "openai.completions", None, (("user", str(prompt or "")),), _max_tokens(body)
    )


def render(endpoint: Endpoint, body: dict[str, Any]) -> RenderedCall:
    if endpoint == "anthropic.messages":
        return render_anthropic(body)
    if endpoint == "openai.completions":
        return render_openai_completion(body)
    return render_openai_chat(body)
