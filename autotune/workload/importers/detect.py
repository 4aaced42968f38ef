"""Which importer a file needs, read from its first bytes (``workload import`` without --from)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.errors import InputError

PEEK_BYTES = 64 * 1024
# Body fields (and message roles, below) of one API that the other does not have.
OPENAI_ONLY = ("prompt", "n", "logprobs", "max_completion_tokens", "response_format")
ANTHROPIC_ONLY = ("system", "anthropic_version", "stop_sequences", "thinking", "metadata")


def detect_source(source: Path) -> str:
    """The ``--from`` value for ``source``; one clear InputError when it cannot tell."""
    if source.is_dir():
        files = sorted(source.glob("*.json"))
        if files and _kind_of_text(_peek(files[0])) == "weka":
            return "weka"
        raise _unknown(source, "a directory without Weka trace files (*.json)")
    kind = _kind_of_text(_peek(source))
    if kind is None:
        raise _unknown(source, "not a trace format autotune knows")
    if kind == "log":
        raise _unknown(source, "a request log, but not whether of OpenAI or Anthropic requests")
    return kind


def _peek(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            return handle.read(PEEK_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from exc


def _kind_of_text(text: str) -> str | None:
    """weka, mooncake, sharegpt, openai-log, anthropic-log; "log" when a log of either; None."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        return "sharegpt" if '"conversations"' in stripped[:PEEK_BYTES] else None
    lines = [line for line in stripped.splitlines() if line.strip()]
    try:
        rows: list[Any] = [json.loads(line) for line in lines[:-1] or lines]
    except (ValueError, RecursionError):  # one JSON document larger than its first line, or junk
        if stripped.startswith("{") and '"requests"' in stripped and '"hash_ids"' in stripped:
            return "weka"
        return None
    if not rows or not isinstance(rows[0], dict):
        return None
    if {"requests", "block_size"} <= rows[0].keys():
        return "weka"
    if {"timestamp", "input_length", "output_length"} <= rows[0].keys():
        return "mooncake"
    kinds = {_log_kind(row) for row in rows if isinstance(row, dict)}
    for kind in ("anthropic-log", "openai-log", "log"):
        if kind in kinds:
            return kind
    return None


def _log_kind(row: dict[str, Any]) -> str | None:
    """A request log line's API: openai-log, anthropic-log, "log" (either), None (neither)."""
    request = row.get("request")
    body = request.get("body") if isinstance(request, dict) else row
    if not isinstance(body, dict) or not ("messages" in body or "prompt" in body):
        return None
    path = str(request.get("path") or request.get("url") or "") if isinstance(request, dict) else ""
    roles = {m.get("role") for m in body.get("messages") or () if isinstance(m, dict)}
    if path.endswith("/messages") or any(key in body for key in ANTHROPIC_ONLY):
        return "anthropic-log"
    if "completions" in path or roles & {"system", "tool"} or any(k in body for k in OPENAI_ONLY):
        return "openai-log"
    return "log"


def _unknown(source: Path, what: str) -> InputError:
    return InputError(
        f"{source}: {what}; name the format with --from "
        "(weka, mooncake, sharegpt, openai-log, anthropic-log)"
    )
