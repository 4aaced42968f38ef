"""Import request logs: JSONL of OpenAI or Anthropic request bodies (literal content).

A line is a request body, or a recorded pair in claude-trace style:
``{"request": {"body", "timestamp"?, "headers"?}, "response": {"body" | "body_raw"}}``.
Timestamps (seconds) and response usage are used when present. Sessions come
from Claude Code's ``X-Claude-Code-Session-Id`` header or the Anthropic
``metadata.user_id``; turns that extend an earlier prompt become deltas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.errors import WorkloadError
from autotune.workload.builder import ObservedCall, WorkloadBuilder
from autotune.workload.importers._report import ImportReport
from autotune.workload.io import Workload
from autotune.workload.plan import Endpoint
from autotune.workload.render import render
from autotune.workload.sse import summarize_response

SESSION_HEADER = "x-claude-code-session-id"


def session_key(headers: dict[str, Any], body: dict[str, Any]) -> str | None:
    """Claude Code's session header, else the Anthropic ``metadata.user_id``."""
    for name, value in headers.items():
        if name.lower() == SESSION_HEADER and value:
            return str(value)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("user_id"):
        return str(metadata["user_id"])
    return None


def _endpoint(kind: str, body: dict[str, Any]) -> Endpoint:
    if kind == "anthropic":
        return "anthropic.messages"
    return "openai.chat" if "messages" in body else "openai.completions"


def _response_bytes(response: Any) -> bytes:
    if not isinstance(response, dict):
        return b""
    if isinstance(response.get("body"), dict):
        return json.dumps(response["body"]).encode()
    raw = response.get("body_raw")
    return raw.encode() if isinstance(raw, str) else b""


def import_requests_log(source: Path, *, kind: str) -> tuple[Workload, ImportReport]:
    """``kind`` is ``openai`` or ``anthropic``. Raises WorkloadError if nothing is usable."""
    report = ImportReport(str(source))
    try:
        lines = source.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{source}: cannot read request log: {exc}") from exc
    builder = WorkloadBuilder(name=source.stem, source={"kind": f"{kind}-log", "path": str(source)})
    for line in lines:
        if not line.strip():
            continue
        report.read["lines"] += 1
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # a 5,000-digit integer, 100,000 brackets deep
            report.dropped["invalid JSON line"] += 1
            continue
        request = row.get("request") if isinstance(row, dict) else None
        body = request.get("body") if isinstance(request, dict) else row
        if not isinstance(body, dict) or not ("messages" in body or "prompt" in body):
            report.dropped["no request body with messages / prompt"] += 1
            continue
        call = render(_endpoint(kind, body), body)
        if not call.messages:
            report.dropped["request without messages"] += 1
            continue
        headers = request.get("headers") if isinstance(request, dict) else None
        response = row.get("response") if isinstance(row, dict) else None
        summary = summarize_response(_response_bytes(response))
        start_s = request.get("timestamp") if isinstance(request, dict) else None
        end_s = response.get("timestamp") if isinstance(response, dict) else None
        builder.add(
            ObservedCall(
                call=call,
                session_key=session_key(headers if isinstance(headers, dict) else {}, body),
                start_s=float(start_s) if isinstance(start_s, int | float) else 0.0,
                end_s=float(end_s) if isinstance(end_s, int | float) else None,
                output_tokens=summary.output_tokens,
                output_text=summary.text or None,
            )
        )
        report.read["requests"] += 1
    if not builder.entries:
        raise WorkloadError(f"{source}: no usable requests in the log")
    for reason, count in builder.adjusted.items():
        report.adjusted[reason] += count
    return builder.workload(), report
