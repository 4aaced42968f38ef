"""An httpx streaming client for one request at a time, never raising into the runner.

``send_request`` posts one PlannedRequest, reads its SSE stream and returns a
``RequestOutcome``: the RequestRecord plus the request's inter-chunk gaps
(for the ITL distribution; not kept in the record). Every failure (HTTP
status, timeout, refused connection, cut stream, malformed SSE) becomes a
record with ``error`` set.

Timing follows `vllm bench serve`: TTFT at the first event carrying
``choices`` (OpenAI) or a content delta (Anthropic); ITL between successive
such events; E2E at the last data event. Durations are wall seconds times
``time_scale`` (modelled seconds, see records.py); in lockstep with the simulator
(``clocked_at_s``) they are the simulator's own dates of its events (``: t=`` lines,
``autotune/sim/server/lockstep.py``), so the host's load cannot move them.

The hot loop avoids per-chunk overhead: raw bytes, one split per read, one
``json.loads`` per event, one timestamp per read (the events of one read
arrived together).

Timeouts (wall seconds; every call the replay makes has one, see the constants):
a request's connect is bounded by ``CONNECT_TIMEOUT_S`` and the whole request by
its ``timeout_s``, but its reads are not, because a healthy stream can be
silent for minutes (a 100k-token prefill on a slow GPU before the first token).
The short calls (``/v1/models``, ``/tokenize``) are bounded by ``CALL_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from autotune.errors import ReplayError, ServerNotAnswering
from autotune.replay.lockstep_wire import AT_HEADER, SEQ_HEADER, STAMP_PREFIX, read_stamp
from autotune.replay.payloads import ENDPOINT_PATHS, request_body, request_headers
from autotune.replay.records import RequestError, RequestRecord
from autotune.workload.plan import PlannedRequest

# A TCP connect to a live host completes in milliseconds, even when the server process
# is busy or stopped (the kernel's listen backlog accepts for it): 10 s passes only
# when the host is unreachable or the backlog is full.
CONNECT_TIMEOUT_S = 10.0
# /v1/models and /tokenize are answered by vLLM's API server process in milliseconds,
# however busy the GPU (the engine runs in another process); 30 s leaves room for a
# CPU-starved host and still tells a stopped or hung server within half a minute.
CALL_TIMEOUT_S = 30.0
CALL_TIMEOUT = httpx.Timeout(CALL_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
# A generation request: connect bounded, reads not (the request's own time limit,
# ``timeout_s``, bounds it whole; the trial's time limit is the backstop).
STREAM_TIMEOUT = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)

_DATA = b"data:"
_DONE = b"[DONE]"
# A compact vLLM token chunk (choices, no finish reason, usage or error) needs no
# JSON parsing. Keys are matched with their quotes: inside a JSON string a quote
# is escaped, so text content cannot fake them. Anything else is parsed.
_CHOICES = b'"choices":[{'
_NO_FINISH = b'"finish_reason":null'
_USAGE = b'"usage":{'
_ERROR = b'"error"'
# The longest SSE line (or error body) read: a vLLM event is one token's delta, a few hundred
# bytes, and its last event (usage) not much more. A line that runs past this is a broken
# server or proxy: the request fails (``line-too-long``) rather than buffer it without end.
MAX_SSE_LINE_BYTES = 1 << 20
# In lockstep a stalled stream (a fault modelled time cannot see) still ends, this many
# times later than the modelled timeout would on scaled wall time.
LOCKSTEP_WALL_TIMEOUT_FACTOR = 4.0


class _StreamFault(Exception):
    """An error event inside a 200 stream (vLLM reports late failures this way)."""

    def __init__(self, error: RequestError, detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


@dataclass(slots=True)
class _Stream:
    """What a stream has said so far."""

    chunk_times: list[float] = field(default_factory=list)  # content events: perf_counter or date
    end: float | None = None  # the last data event: perf_counter, or its date in lockstep
    stamp: float | None = None  # clocked: the date of the events being read (modelled)
    end_order: int | None = None  # clocked: its place among the simulator's ends
    finished: bool = False  # saw [DONE] / message_stop
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """A finished request: its record and its inter-chunk gaps (modelled seconds)."""

    record: RequestRecord
    gaps_s: np.ndarray
    end_clock_s: float  # when it finished on the driver's clock: perf_counter, or modelled
    end_order: int | None = None  # lockstep: its place among the simulator's ends


def _fault_from_error_payload(error: Any) -> _StreamFault:
    if isinstance(error, dict):
        code = error.get("code")
        message = str(error.get("message", error))
    else:
        code, message = None, str(error)
    kind = RequestError.HTTP_4XX if isinstance(code, int) and code < 500 else RequestError.HTTP_5XX
    return _StreamFault(kind, message[:200])


def _on_openai_event(stream: _Stream, data: dict[str, Any], now: float) -> None:
    stream.end = now
    choices = data.get("choices")
    if choices:
        stream.chunk_times.append(now)
        reason = choices[0].get("finish_reason")
        if reason:
            stream.finish_reason = reason
    usage = data.get("usage")
    if usage:
        stream.output_tokens = usage.get("completion_tokens")
        stream.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details")
        if details:
            stream.cached_tokens = details.get("cached_tokens")
    if "error" in data or data.get("object") == "error":
        raise _fault_from_error_payload(data.get("error", data))


def _on_anthropic_event(stream: _Stream, data: dict[str, Any], now: float) -> None:
    stream.end = now
    kind = data.get("type")
    if kind == "content_block_delta":
        stream.chunk_times.append(now)
    elif kind == "message_start":
        usage = data["message"].get("usage") or {}
        cached = usage.get("cache_read_input_tokens")
        created = usage.get("cache_creation_input_tokens") or 0
        stream.prompt_tokens = usage.get("input_tokens", 0) + (cached or 0) + created
        stream.cached_tokens = cached
    elif kind == "message_delta":
        usage = data.get("usage") or {}
        if "output_tokens" in usage:
            stream.output_tokens = usage["output_tokens"]
        reason = (data.get("delta") or {}).get("stop_reason")
        if reason:
            stream.finish_reason = reason
    elif kind == "message_stop":
        stream.finished = True
    elif kind == "error":
        raise _fault_from_error_payload(data.get("error"))


async def _read_stream(
    response: httpx.Response, stream: _Stream, anthropic: bool, clocked: bool = False
) -> None:
    """Read the SSE body; event times from the wall clock, or (``clocked``) the date lines."""
    on_event = _on_anthropic_event if anthropic else _on_openai_event
    pending = b""
    now = 0.0
    async for raw in response.aiter_raw():
        if not clocked:
            now = time.perf_counter()
        pending += raw
        if b"\n" not in raw:
            if len(pending) > MAX_SSE_LINE_BYTES:
                raise _StreamFault(
                    RequestError.LINE_TOO_LONG,
                    f"an SSE line past {MAX_SSE_LINE_BYTES:,} bytes without its end",
                )
            continue
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if clocked and line.startswith(STAMP_PREFIX):
                now, order = read_stamp(line)
                stream.stamp = now
                stream.end_order = order if order is not None else stream.end_order
                continue
            if not line.startswith(_DATA):
                continue  # "event:" lines, comments, blank separators
            payload = line[5:].strip()
            if payload == _DONE:
                stream.finished = True
                continue
            if (  # a plain token chunk needs no parsing (see _CHOICES)
                _CHOICES in payload
                and _NO_FINISH in payload
                and _USAGE not in payload
                and _ERROR not in payload
                and not anthropic
            ):
                stream.end = now
                stream.chunk_times.append(now)
                continue
            data = json.loads(payload)
            if not isinstance(data, dict):
                raise ValueError(f"SSE data is not an object: {payload[:80]!r}")
            on_event(stream, data, now)


async def _read_error_body(response: httpx.Response) -> bytes:
    """An error answer's body, its first ``MAX_SSE_LINE_BYTES`` only (enough for a message)."""
    body = bytearray()
    async for raw in response.aiter_bytes():
        body += raw
        if len(body) >= MAX_SSE_LINE_BYTES:
            break
    return bytes(body[:MAX_SSE_LINE_BYTES])


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0][:200] if stripped else ""


def _error_message(body: str) -> str:
    """The message of an OpenAI / Anthropic / FastAPI error body, else its first line."""
    try:
        data = json.loads(body)
    except ValueError:
        return _first_line(body)
    if isinstance(data, dict):
        inner = data.get("error", data)
        if isinstance(inner, dict):
            inner = inner.get("message", inner.get("detail", inner))
        if isinstance(inner, str):
            return _first_line(inner)
    return _first_line(body)


async def send_request(
    client: httpx.AsyncClient,
    request: PlannedRequest,
    *,
    model_name: str,
    origin_s: float,
    time_scale: float = 1.0,
    timeout_s: float = 600.0,
    api_key: str | None = None,
    salt: str | None = None,
    record_id: str | None = None,
    clocked_at_s: float | None = None,
    seq: int = 0,
) -> RequestOutcome:
    """Send ``request`` and read its stream to the end; never raises for request failures.

    ``origin_s`` is the replay's start on ``time.perf_counter``; ``timeout_s``
    is in modelled seconds (divided by ``time_scale`` for the wall clock).
    ``clocked_at_s``: in lockstep with the simulator, the modelled time this is sent at
    on its clock (``origin_s`` then is the replay's start on that clock) and ``seq`` its
    place in the replay's order; times are the simulator's dates. The modelled timeout
    is the driver's then; here only a stalled stream is cut, much later.
    """
    anthropic = request.endpoint == "anthropic.messages"
    body = request_body(request, model_name=model_name, salt=salt)
    headers = request_headers(request.endpoint, api_key)
    clocked = clocked_at_s is not None
    wall_timeout_s = timeout_s / time_scale
    if clocked:
        headers.update({AT_HEADER: repr(clocked_at_s), SEQ_HEADER: str(seq)})
        wall_timeout_s *= LOCKSTEP_WALL_TIMEOUT_FACTOR
    stream = _Stream()
    error: RequestError | None = None
    status: int | None = None
    detail: str | None = None
    sent = clocked_at_s if clocked_at_s is not None else time.perf_counter()
    try:
        async with asyncio.timeout(wall_timeout_s):
            async with client.stream(
                "POST",
                ENDPOINT_PATHS[request.endpoint],
                content=body,
                headers=headers,
                timeout=STREAM_TIMEOUT,
            ) as response:
                status = response.status_code
                if status >= 400:
                    text = (await _read_error_body(response)).decode(errors="replace")
                    error = RequestError.HTTP_4XX if status < 500 else RequestError.HTTP_5XX
                    detail = _error_message(text)
                else:
                    await _read_stream(response, stream, anthropic, clocked)
                    if not stream.finished:
                        error, detail = (
                            RequestError.CUT_STREAM,
                            "stream ended without its end event",
                        )
    except TimeoutError:
        error, detail = RequestError.TIMEOUT, f"no complete answer within {timeout_s:g}s"
    except _StreamFault as fault:
        error, detail = fault.error, fault.detail
    except (ValueError, KeyError, TypeError) as exc:  # JSON / event shape
        error, detail = RequestError.MALFORMED, _first_line(str(exc))
    except httpx.TimeoutException as exc:
        error, detail = RequestError.TIMEOUT, _first_line(str(exc)) or type(exc).__name__
    except (httpx.HTTPError, OSError) as exc:
        error = RequestError.CONNECT if status is None else RequestError.CUT_STREAM
        detail = _first_line(str(exc)) or type(exc).__name__
    ended = time.perf_counter()
    if clocked:  # the last date read; an error before any: where it was sent
        ended = stream.stamp if stream.stamp is not None else sent
    return _outcome(
        request, stream, sent=sent, ended=ended, origin_s=origin_s,
        scale=1.0 if clocked else time_scale,
        error=error, status=status, detail=detail, record_id=record_id,
    )  # fmt: skip


def _outcome(
    request: PlannedRequest,
    stream: _Stream,
    *,
    sent: float,
    ended: float,
    origin_s: float,
    scale: float,
    error: RequestError | None,
    status: int | None,
    detail: str | None,
    record_id: str | None,
) -> RequestOutcome:
    times = stream.chunk_times
    gaps_s = np.diff(np.asarray(times, dtype=np.float64)) * scale if len(times) > 1 else _NO_GAPS
    end = stream.end if error is None and stream.end is not None else ended
    output_tokens = stream.output_tokens if stream.output_tokens is not None else len(times)
    record = RequestRecord(
        id=record_id or request.id,
        session=request.session,
        endpoint=request.endpoint,
        send_s=(sent - origin_s) * scale,
        ttft_s=(times[0] - sent) * scale if times else None,
        e2e_s=(end - sent) * scale,
        output_tokens=output_tokens,
        prompt_tokens=stream.prompt_tokens,
        cached_tokens=stream.cached_tokens,
        chunks=len(times),
        itl_mean_s=float(gaps_s.mean()) if gaps_s.size else None,
        itl_max_s=float(gaps_s.max()) if gaps_s.size else None,
        finish_reason=stream.finish_reason,
        error=error,
        http_status=status,
        error_detail=detail,
    )
    return RequestOutcome(
        record=record, gaps_s=gaps_s, end_clock_s=ended, end_order=stream.end_order
    )


_NO_GAPS = np.zeros(0, dtype=np.float64)


async def fetch_model_name(client: httpx.AsyncClient, *, api_key: str | None = None) -> str:
    """The first model id the server lists at /v1/models.

    Raises ServerNotAnswering when the server accepts the connection but sends no
    answer within ``CALL_TIMEOUT_S`` (stopped or hung), ReplayError when it cannot
    be asked otherwise or lists none.
    """
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = await client.get("/v1/models", headers=headers, timeout=CALL_TIMEOUT)
        response.raise_for_status()
        models = response.json()["data"]
        return str(models[0]["id"])
    except httpx.TimeoutException as exc:
        raise ServerNotAnswering(
            f"the server at {client.base_url} did not answer GET /v1/models within "
            f"{CALL_TIMEOUT_S:g} s ({type(exc).__name__}): is it stopped (SIGSTOP) or hung?"
        ) from exc
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ReplayError(
            f"cannot read the model name from {str(client.base_url).rstrip('/')}/v1/models: {exc}"
        ) from exc
