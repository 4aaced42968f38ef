"""Response bodies in vLLM's OpenAI and Anthropic shapes, streaming and not.

Field sets follow vLLM's pydantic protocol models (compact JSON, as
``model_dump_json`` writes it). Usage always carries
``prompt_tokens_details.cached_tokens`` (vLLM needs --enable-prompt-tokens-details
for that; the simulator always reports it).
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
ANTHROPIC_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "abort": "end_turn"}
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
_WORDS = ("the", "model", "writes", "a", "token", "for", "each", "step", "of", "decoding")


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def sse(value: Any) -> bytes:
    """One OpenAI-style SSE event."""
    return b"data: " + _dumps(value) + b"\n\n"


def sse_event(event: str, value: Any) -> bytes:
    """One Anthropic-style SSE event (``event:`` line + ``data:`` line)."""
    return b"event: " + event.encode() + b"\ndata: " + _dumps(value) + b"\n\n"


def render_tokens(start: int, count: int) -> str:
    """``count`` generated tokens as words (one word per token), from position ``start``."""
    return "".join(f"{_WORDS[i % len(_WORDS)]} " for i in range(start, start + count))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def anthropic_usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": completion_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def openai_error(message: str, status: int, kind: str) -> dict[str, Any]:
    """vLLM's ``ErrorResponse``: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def anthropic_error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def chat_chunk(
    request_id: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def completion_chunk(
    request_id: str, created: int, model: str, text: str, finish_reason: str | None
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        ],
    }


def usage_chunk(
    request_id: str, created: int, model: str, obj: str, usage_: dict[str, Any]
) -> dict[str, Any]:
    """The final ``stream_options.include_usage`` chunk: empty choices, the usage."""
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def chat_completion(
    request_id: str, created: int, model: str, text: str, finish_reason: str, usage_: dict
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        ],
        "usage": usage_,
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def text_completion(
    request_id: str, created: int, model: str, text: str, finish_reason: str, usage_: dict
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        ],
        "usage": usage_,
        "kv_transfer_params": None,
    }


def anthropic_message(
    message_id: str, model: str, text: str, stop_reason: str | None, usage_: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}] if text is not None else [],
        "model": model,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage_,
    }


def anthropic_stream_start(message_id: str, model: str, usage_: dict[str, Any]) -> bytes:
    """``message_start`` then ``content_block_start`` for the text block."""
    start = {
        "type": "message_start",
        "message": {**anthropic_message(message_id, model, "", None, usage_), "content": []},
    }
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    return sse_event("message_start", start) + sse_event("content_block_start", block)


def anthropic_delta(text: str) -> bytes:
    return sse_event(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
    )


def anthropic_stream_end(stop_reason: str, usage_: dict[str, Any]) -> bytes:
    """``content_block_stop``, ``message_delta`` (stop reason + usage), ``message_stop``."""
    return (
        sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
        + sse_event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": usage_,
            },
        )
        + sse_event("message_stop", {"type": "message_stop"})
        + DONE
    )
