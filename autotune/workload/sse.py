"""Read usage and response text out of a recorded response (JSON body or SSE stream)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ResponseSummary:
    """What a response said about itself (None: not reported)."""

    output_tokens: int | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    text: str = ""
    stop: str | None = None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and value >= 0 else None


def _usage(usage: Any, summary: dict[str, Any]) -> None:
    if not isinstance(usage, dict):
        return
    for key, target in (
        ("output_tokens", "output_tokens"),
        ("completion_tokens", "output_tokens"),
        ("input_tokens", "input_tokens"),
        ("prompt_tokens", "input_tokens"),
        ("cache_read_input_tokens", "cached_tokens"),
    ):
        if _int(usage.get(key)) is not None:
            summary[target] = usage[key]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and _int(details.get("cached_tokens")) is not None:
        summary["cached_tokens"] = details["cached_tokens"]


def _text(obj: dict[str, Any], *keys: str) -> str:
    """The first non-empty string value among ``keys``."""
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _event(event: Any, summary: dict[str, Any], texts: list[str]) -> None:
    """Fold one JSON object (an SSE data payload or a whole body) into the summary."""
    if not isinstance(event, dict):
        return
    _usage(event.get("usage"), summary)
    kind = event.get("type")
    if kind == "message_start":
        _usage((event.get("message") or {}).get("usage"), summary)
    elif kind == "content_block_delta":
        delta = event.get("delta") or {}
        texts.append(_text(delta, "text", "thinking", "partial_json"))
    elif kind == "message_delta":
        summary["stop"] = (event.get("delta") or {}).get("stop_reason") or summary.get("stop")
    elif kind == "message" and isinstance(event.get("content"), list):  # a non-streamed body
        texts.extend(_text(block, "text") for block in event["content"] if isinstance(block, dict))
        summary["stop"] = event.get("stop_reason")
    for choice in event.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        piece = choice.get("delta") or choice.get("message") or {}
        texts.append(_text(piece, "content", "reasoning_content") or _text(choice, "text"))
        summary["stop"] = choice.get("finish_reason") or summary.get("stop")


def summarize_response(raw: bytes) -> ResponseSummary:
    """Parse a JSON body or an SSE stream (``data: {...}`` lines); tolerant of junk."""
    summary: dict[str, Any] = {}
    texts: list[str] = []
    body = raw.strip()
    if body.startswith(b"{"):
        with contextlib.suppress(json.JSONDecodeError):
            _event(json.loads(body), summary, texts)
    else:
        for line in body.splitlines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            try:
                _event(json.loads(payload), summary, texts)
            except json.JSONDecodeError:
                continue
    return ResponseSummary(text="".join(texts), **summary)
