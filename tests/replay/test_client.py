"""The client's fault paths (httpx.MockTransport) and what it sends; the happy path runs
against a real server in test_runner.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from autotune.errors import ReplayError
from autotune.replay.client import RequestOutcome, fetch_model_name, send_request
from autotune.replay.records import RequestError
from tests.replay.conftest import make_plan

Handler = Callable[[httpx.Request], httpx.Response]


class _Body(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes], delay_s: float = 0.0, fail: Exception | None = None):
        self._parts, self._delay_s, self._fail = parts, delay_s, fail

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            await asyncio.sleep(self._delay_s)
            yield part
        if self._fail is not None:
            raise self._fail


def _sse(*events: object) -> list[bytes]:
    return [f"data: {json.dumps(e)}\n\n".encode() for e in events]


def _chunk(text: str, finish: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


USAGE = {
    "choices": [],
    "usage": {
        "prompt_tokens": 40,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 32},
    },
}


def _send(handler: Handler, *, endpoint: str = "openai.chat", **kwargs: object) -> RequestOutcome:
    async def go() -> RequestOutcome:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(base_url="http://stub", transport=transport) as client:
            request = make_plan(output_tokens=3, endpoint=endpoint).requests[0]  # type: ignore[arg-type]
            return await send_request(
                client, request, model_name="m", origin_s=time.perf_counter(), **kwargs
            )

    return asyncio.run(go())


def _streaming(parts: list[bytes], **kwargs: object) -> Handler:
    return lambda request: httpx.Response(200, stream=_Body(parts, **kwargs))


def test_complete_stream_gives_usage_cached_tokens_and_timings() -> None:
    parts = [*_sse(_chunk("a"), _chunk("b"), _chunk("c", "length"), USAGE), b"data: [DONE]\n\n"]
    outcome = _send(_streaming(parts, delay_s=0.01))
    record = outcome.record
    assert record.ok and record.http_status == 200
    assert (record.output_tokens, record.prompt_tokens, record.cached_tokens) == (3, 40, 32)
    assert record.chunks == 3 and record.finish_reason == "length"
    assert record.ttft_s is not None and record.ttft_s >= 0.009
    assert record.e2e_s is not None and record.e2e_s >= record.ttft_s + 0.015
    assert len(outcome.gaps_s) == 2 and record.itl_mean_s == pytest.approx(outcome.gaps_s.mean())


def test_events_split_across_reads_are_reassembled() -> None:
    whole = b"".join(_sse(_chunk("a"), _chunk("b", "stop"), USAGE)) + b"data: [DONE]\n\n"
    parts = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    record = _send(_streaming(parts)).record
    assert record.ok and record.chunks == 2 and record.output_tokens == 3


def test_time_scale_multiplies_measured_durations() -> None:
    parts = [*_sse(_chunk("a"), _chunk("b"), USAGE), b"data: [DONE]\n\n"]
    record = _send(_streaming(parts, delay_s=0.02), time_scale=10.0).record
    assert record.ttft_s is not None and record.ttft_s >= 0.19  # 0.02 s wall x 10


@pytest.mark.parametrize(
    ("status", "error"), [(400, RequestError.HTTP_4XX), (503, RequestError.HTTP_5XX)]
)
def test_http_errors_keep_status_and_first_line(status: int, error: RequestError) -> None:
    outcome = _send(lambda request: httpx.Response(status, text="model overloaded\nmore"))
    record = outcome.record
    assert record.error is error and record.http_status == status
    assert record.error_detail == "model overloaded"
    assert record.ttft_s is None and record.output_tokens == 0


def test_stream_without_done_is_cut() -> None:
    record = _send(_streaming(_sse(_chunk("a")))).record
    assert record.error is RequestError.CUT_STREAM and record.chunks == 1


def test_stream_broken_by_the_network_is_cut() -> None:
    fault = httpx.RemoteProtocolError("peer closed connection")
    record = _send(_streaming(_sse(_chunk("a")), fail=fault)).record
    assert record.error is RequestError.CUT_STREAM
    assert record.error_detail is not None and "peer closed" in record.error_detail


def test_malformed_json_event() -> None:
    record = _send(_streaming([b"data: {not json\n\n"])).record
    assert record.error is RequestError.MALFORMED


def test_error_event_inside_a_stream() -> None:
    parts = _sse(_chunk("a"), {"object": "error", "message": "engine dead", "code": 500})
    record = _send(_streaming(parts)).record
    assert record.error is RequestError.HTTP_5XX and record.error_detail == "engine dead"


def test_timeout_is_in_modelled_seconds() -> None:
    started = time.perf_counter()
    record = _send(
        _streaming(_sse(_chunk("a")), delay_s=5.0), timeout_s=2.0, time_scale=10.0
    ).record
    assert record.error is RequestError.TIMEOUT
    assert time.perf_counter() - started < 2.0  # 2 modelled s = 0.2 s wall


def test_refused_connection() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    record = _send(refuse).record
    assert record.error is RequestError.CONNECT and record.http_status is None


def _captured(endpoint: str, **kwargs: object) -> httpx.Request:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(400, text="stop here")

    _send(handler, endpoint=endpoint, **kwargs)
    return seen[0]


def test_openai_requests_ask_for_exact_output_and_usage() -> None:
    request = _captured("openai.chat", api_key="sk-secret")
    body = json.loads(request.content)
    assert request.url.path == "/v1/chat/completions"
    assert body["max_tokens"] == body["min_tokens"] == 3 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"][0] == {"role": "system", "content": "You are a stub."}
    assert request.headers["authorization"] == "Bearer sk-secret"


def test_anthropic_requests_have_no_ignore_eos_and_carry_version() -> None:
    request = _captured("anthropic.messages", salt="recycle-1")
    body = json.loads(request.content)
    assert request.url.path == "/v1/messages"
    assert body["max_tokens"] == 3 and "ignore_eos" not in body and "min_tokens" not in body
    assert body["system"].startswith("[recycle-1] ")
    assert request.headers["anthropic-version"]
    assert "authorization" not in request.headers


def test_completions_prompt_is_rendered_text() -> None:
    body = json.loads(_captured("openai.completions").content)
    assert body["prompt"].startswith("You are a stub.\n\nuser: session 0 turn 0")


def test_anthropic_stream() -> None:
    events = [
        {
            "type": "message_start",
            "message": {"usage": {"input_tokens": 8, "cache_read_input_tokens": 32}},
        },
        {"type": "content_block_delta", "delta": {"text": "a"}},
        {"type": "content_block_delta", "delta": {"text": "b"}},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens"},
            "usage": {"output_tokens": 2},
        },
        {"type": "message_stop"},
    ]
    parts = [b"event: x\n" + part for part in _sse(*events)]
    record = _send(_streaming(parts), endpoint="anthropic.messages").record
    assert record.ok and record.chunks == 2 and record.output_tokens == 2
    assert (record.prompt_tokens, record.cached_tokens) == (40, 32)
    assert record.finish_reason == "max_tokens"


def test_model_name_from_v1_models_and_error_when_absent() -> None:
    async def ask(handler: Handler) -> str:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(base_url="http://stub", transport=transport) as client:
            return await fetch_model_name(client)

    listing = {"data": [{"id": "qwen"}, {"id": "other"}]}
    assert asyncio.run(ask(lambda r: httpx.Response(200, json=listing))) == "qwen"
    with pytest.raises(ReplayError, match="v1/models"):
        asyncio.run(ask(lambda r: httpx.Response(200, json={"data": []})))


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "maximum context length is 16384 tokens", "code": 400}},
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "maximum context length is 16384 tokens",
            },
        },
        {"detail": "maximum context length is 16384 tokens"},
    ],
)
def test_http_error_detail_is_the_message_of_a_json_body(body: dict[str, object]) -> None:
    record = _send(lambda request: httpx.Response(400, json=body)).record
    assert record.error_detail == "maximum context length is 16384 tokens"
