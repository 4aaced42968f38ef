"""What the recording proxy keeps: finished exchanges turned into workload entries.

All of the work (JSON parsing of the request and the streamed response,
prompt rendering, delta detection, writing the file) runs on one worker
thread, in submission order, so the proxy's event loop only hands over the
bytes it already relayed and never waits on a parse or a file write. The
workload file is rewritten atomically, at most every ``FLUSH_INTERVAL_S``
and on close.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.workload.builder import ObservedCall, WorkloadBuilder
from autotune.workload.importers.requests_log import SESSION_HEADER, session_key
from autotune.workload.io import write_workload
from autotune.workload.plan import Endpoint
from autotune.workload.render import render
from autotune.workload.sse import summarize_response

FLUSH_INTERVAL_S = 1.0
BILLING_HEADER_NOTICE = (
    "autotune record: Claude Code puts a per-request x-anthropic-billing-header block first "
    "in its system prompt, so your server misses the prefix cache on every request. Set "
    'CLAUDE_CODE_ATTRIBUTION_HEADER=0 in Claude Code\'s environment (or under "env" in '
    "~/.claude/settings.json) and restart it. The recording drops the block (it replays as "
    "if the setting were on) and says so in its header."
)
_log = logging.getLogger(__name__)


def unknown_model_notice(model: object) -> str:
    """What to set when the server does not serve the model a client asked for."""
    return (
        f"autotune record: the server answered 404 to a request for model {model!r}. Claude "
        "Code asks for its own model names: set ANTHROPIC_MODEL (and ANTHROPIC_DEFAULT_"
        "HAIKU_MODEL, _SONNET_, _OPUS_ for background calls and subagents) to the server's "
        f"served model name (GET /v1/models), or start the server with --served-model-name {model}."
    )


@dataclass
class Exchange:
    """One relayed call, as the proxy saw it; times from ``time.perf_counter``."""

    endpoint: Endpoint
    raw_body: bytes
    session_header: str | None
    start_s: float
    start_perf: float
    first_byte_perf: float | None = None
    end_perf: float = 0.0
    chunks: list[bytes] = field(default_factory=list)


def _parse_body(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def observed_call(exchange: Exchange) -> ObservedCall | None:
    """The workload view of a completed 2xx exchange; None when its body is not a JSON object."""
    body = _parse_body(exchange.raw_body)
    if body is None:
        return None
    summary = summarize_response(b"".join(exchange.chunks))
    e2e_s = exchange.end_perf - exchange.start_perf
    expect: dict[str, object] = {"e2e_s": round(e2e_s, 4)}
    if exchange.first_byte_perf is not None:
        expect["first_byte_s"] = round(exchange.first_byte_perf - exchange.start_perf, 4)
    if summary.input_tokens is not None:
        expect["input_tokens"] = summary.input_tokens
    if summary.cached_tokens is not None:
        expect["cached_tokens"] = summary.cached_tokens
    headers = {SESSION_HEADER: exchange.session_header} if exchange.session_header else {}
    return ObservedCall(
        call=render(exchange.endpoint, body),
        session_key=session_key(headers, body),
        start_s=exchange.start_s,
        end_s=exchange.start_s + e2e_s,
        output_tokens=summary.output_tokens,
        output_text=summary.text or None,
        expect=expect,
    )


@dataclass
class Recorder:
    """Accumulates observed calls on its worker thread and writes the workload file."""

    out: Path
    anonymize: bool = False
    notify: Callable[[str], None] = _log.warning  # tells the user, once per kind of problem
    builder: WorkloadBuilder = field(init=False)
    recorded: int = 0
    skipped: int = 0
    _dirty: bool = False
    _told: set[str] = field(default_factory=set)
    _worker: ThreadPoolExecutor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.builder = WorkloadBuilder(
            name=self.out.stem, source={"kind": "recorder"}, anonymize=self.anonymize
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autotune-record")

    def submit(self, exchange: Exchange, *, status: int) -> None:
        """Queue a finished exchange for recording (returns at once)."""
        self._run(self._record, exchange, status)

    def submit_skip(self) -> None:
        """Count a call that will not be recorded (an interrupted stream)."""
        self._run(self._skip)

    def submit_flush(self) -> None:
        """Queue a write of the workload so far."""
        self._run(self.flush)

    def close(self) -> None:
        """Record everything queued, write the file, stop the worker."""
        self._run(self.flush)
        self._worker.shutdown(wait=True)

    def flush(self) -> None:
        """Write the workload so far (atomically) if anything changed."""
        if self._dirty and self.builder.entries:
            self._dirty = False
            write_workload(self.out, self.builder.workload().records())

    def _run(self, task: Any, *args: Any) -> None:
        self._worker.submit(task, *args).add_done_callback(_log_failure)

    def _skip(self) -> None:
        self.skipped += 1

    def _record(self, exchange: Exchange, status: int) -> None:
        observed = observed_call(exchange) if 200 <= status < 300 else None
        if observed is None:
            self.skipped += 1
            if status == 404:
                self._check_model(exchange)
            return
        if observed.call.billing_header:
            self._tell_once(BILLING_HEADER_NOTICE)
        self.builder.add(observed)
        self.recorded += 1
        self._dirty = True

    def _check_model(self, exchange: Exchange) -> None:
        """A 404 naming the requested model: the server serves it under another name."""
        model = (_parse_body(exchange.raw_body) or {}).get("model")
        answer = b"".join(exchange.chunks).decode("utf-8", errors="replace")
        if isinstance(model, str) and model and model in answer:
            self._tell_once(unknown_model_notice(model))

    def _tell_once(self, notice: str) -> None:
        if notice not in self._told:
            self._told.add(notice)
            self.notify(notice)


def _log_failure(future: Future[Any]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        _log.error("autotune record: recording a call failed", exc_info=exc)
