"""The simulator's HTTP face in-process: real engine core and run loop, ASGI transport.

Shapes and wire behaviour against a real socket are in tests/e2e/test_sim_process.py;
these cover request semantics, errors, faults and the scaled clock quickly.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from autotune.engines.vllm_log import parse_engine_stats
from autotune.replay.lockstep_wire import AT_HEADER, SEQ_HEADER, read_stamp
from autotune.sim.server.flags import parse_serve_args
from autotune.sim.server.logs import VllmLog
from autotune.sim.server.server import build_api
from autotune.sim.server.stats_log import StatsLogger

pytestmark = pytest.mark.timeout(60)

BASE = ["llama-3.1-8b", "--hardware", "h100-80g"]
CHAT = [{"role": "user", "content": "tell me something short"}]


def _run(
    flags: list[str],
    scenario: Callable[[httpx.AsyncClient, Any], Awaitable[Any]],
    *,
    base: list[str] = BASE,
) -> tuple[Any, list[str]]:
    """Run ``scenario(client, api)`` against a fresh in-process server; (result, crashes)."""
    crashes: list[str] = []

    async def main() -> Any:
        api = build_api(parse_serve_args([*base, *flags]), on_crash=crashes.append)
        engine = asyncio.create_task(api.runner.run())
        transport = httpx.ASGITransport(app=api.app())
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
                return await scenario(client, api)
        finally:
            engine.cancel()

    return asyncio.run(main()), crashes


def _chat(**extra: Any) -> dict[str, Any]:
    return {"messages": CHAT, **extra}


def test_tokens_are_not_delivered_before_their_scaled_time() -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> tuple[float, float]:
        started, modelled_start_s = time.perf_counter(), api.runner.virtual_now()
        body = _chat(max_tokens=40, ignore_eos=True)
        response = await client.post("/v1/chat/completions", json=body)
        wall_s = time.perf_counter() - started
        assert response.json()["usage"]["completion_tokens"] == 40
        return wall_s, api.runner.core.clock_s - modelled_start_s

    (wall_s, modelled_s), _ = _run(["--time-scale", "5"], scenario)
    assert modelled_s > 0
    assert wall_s >= 0.9 * modelled_s / 5  # never early
    assert wall_s <= modelled_s / 5 + 1.0  # and not dragging


def test_in_lockstep_the_engine_moves_only_as_far_as_the_client_lets_it() -> None:
    """The replay holds the clock: a sent request waits for the client's grant, each grant
    moves the clock to its bound (or the request's end), and the answer comes one event
    per engine step, each dated in modelled seconds, the last with its place among ends."""

    async def scenario(client: httpx.AsyncClient, api: Any) -> tuple[Any, ...]:
        now0 = (await client.post("/autotune/lockstep")).json()["now_s"]
        headers = {AT_HEADER: repr(now0), SEQ_HEADER: "0"}
        body = _chat(max_tokens=20, min_tokens=20, ignore_eos=True, stream=True,
                     stream_options={"include_usage": True})  # fmt: skip
        answer = asyncio.create_task(
            client.post("/v1/chat/completions", json=body, headers=headers)
        )
        await asyncio.sleep(0.3)  # 1.5 modelled seconds of wall time: the engine holds
        held_s = api.runner.core.clock_s
        replies: list[dict[str, Any]] = []
        until_s = now0
        while not replies or not replies[-1]["ended"]:
            until_s += 0.05
            grant = {"until_s": until_s, "sent": 1}
            replies.append((await client.post("/autotune/lockstep/advance", json=grant)).json())
        return now0, held_s, replies, (await answer).text

    (now0, held_s, replies, text), _ = _run(["--time-scale", "5"], scenario)
    assert held_s == now0
    clocks = [reply["now_s"] for reply in replies]
    assert len(clocks) >= 3 and clocks == sorted(clocks)
    for index, clock in enumerate(clocks[:-1]):  # each grant reached (the last: the end)
        assert clock >= now0 + 0.05 * (index + 1)
    stamps = [read_stamp(line.encode()) for line in text.splitlines() if line.startswith(": t=")]
    times = [t for t, _ in stamps]
    assert times == sorted(times) and now0 < times[0] and times[-1] <= clocks[-1]
    assert [order for _, order in stamps] == [None] * (len(stamps) - 1) + [1]
    events = [line for line in text.splitlines() if line.startswith("data: {")]
    contents = [event for event in events if '"content":"' in event and '"role"' not in event]
    assert len(contents) == 20  # one token per step, no MTP: one event each


def test_without_ignore_eos_some_requests_stop_early_at_or_after_min_tokens() -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> list[tuple[str, int]]:
        out = []
        for _ in range(30):
            body = _chat(max_tokens=20, min_tokens=5)
            data = (await client.post("/v1/chat/completions", json=body)).json()
            out.append((data["choices"][0]["finish_reason"], data["usage"]["completion_tokens"]))
        return out

    results, _ = _run(["--time-scale", "1000"], scenario)
    stopped = [n for reason, n in results if reason == "stop"]
    assert stopped and len(stopped) < len(results)
    assert all(5 <= n < 20 for n in stopped)
    assert all(n == 20 for reason, n in results if reason == "length")
    again, _ = _run(["--time-scale", "1000"], scenario)
    assert again == results  # seeded


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/chat/completions", {"model": "other", "messages": CHAT}, 404,
         "The model `other` does not exist."),
        ("/v1/completions", {"prompt": "x " * 200_000, "max_tokens": 1}, 400,
         "This model's maximum context length is"),
        ("/v1/chat/completions", _chat(max_tokens=10**9), 400,
         "'max_tokens' or 'max_completion_tokens' is too large"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages must contain at least one item"),
        ("/v1/chat/completions", _chat(min_tokens="many"), 400, "min_tokens must be"),
    ],
)  # fmt: skip
def test_bad_requests_get_vllms_error_shape(
    path: str, body: dict, status: int, needle: str
) -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> httpx.Response:
        return await client.post(path, json=body)

    response, _ = _run(["--max-model-len", "100000"], scenario)
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"]
    assert error["code"] == status


def test_anthropic_errors_use_the_anthropic_shape() -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> httpx.Response:
        return await client.post("/v1/messages", json={"model": "nope", "messages": CHAT})

    response, _ = _run([], scenario)
    assert response.status_code == 404
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_5xx_fault_answers_500_and_the_engine_keeps_serving() -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> list[int]:
        codes = []
        for _ in range(20):
            response = await client.post("/v1/chat/completions", json=_chat(max_tokens=2))
            codes.append(response.status_code)
        return codes

    codes, crashes = _run(["--time-scale", "1000", "--fault-5xx-rate", "0.5"], scenario)
    assert set(codes) == {200, 500}
    assert not crashes


def test_crash_fault_fails_later_requests_and_reports_once() -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> tuple[list[int], int]:
        codes = []
        for _ in range(4):
            response = await client.post("/v1/chat/completions", json=_chat(max_tokens=3))
            codes.append(response.status_code)
            await asyncio.sleep(0.01)
        return codes, (await client.get("/health")).status_code

    (codes, health), crashes = _run(
        ["--time-scale", "1000", "--fault-crash-after-requests", "2"], scenario
    )
    assert codes[:2] == [200, 200] and codes[2:] == [500, 500]
    assert health == 503
    assert len(crashes) == 1 and "illegal memory access" in crashes[0]


def test_slow_first_token_fault_delays_the_first_token_by_modelled_seconds() -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> float:
        started = time.perf_counter()
        await client.post("/v1/chat/completions", json=_chat(max_tokens=1))
        return time.perf_counter() - started

    wall_s, _ = _run(["--time-scale", "10", "--fault-slow-first-token-s", "3"], scenario)
    assert wall_s >= 0.3


def test_stats_line_is_logged_while_busy_and_parses() -> None:
    out = io.StringIO()

    async def scenario(client: httpx.AsyncClient, api: Any) -> None:
        log = VllmLog(api_pid=1, engine_pid=2, stream=out)
        stats = asyncio.create_task(StatsLogger(api.runner, log, interval_s=10.0).run())
        body = _chat(max_tokens=3000, ignore_eos=True)  # ~20 modelled s: two intervals
        await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(3)))
        stats.cancel()

    _run(["--time-scale", "200"], scenario)
    lines = parse_engine_stats(out.getvalue())
    assert lines, out.getvalue()
    assert any(line.generation_tokens_per_s > 0 for line in lines)


def test_disable_log_stats_drops_the_vllm_metrics_as_vllm_does() -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> tuple[str, str]:
        await client.post("/v1/chat/completions", json=_chat(max_tokens=2))
        return (await client.get("/metrics")).text, ""

    (text, _), _ = _run(["--time-scale", "1000", "--disable-log-stats"], scenario)
    assert "vllm:" not in text
    (text, _), _ = _run(["--time-scale", "1000"], scenario)
    assert "vllm:generation_tokens_total" in text


QWEN = ["--hardware", "rtx4080s-32g", "--language-model-only", "--kv-cache-memory-bytes", "8G"]


def _run_qwen(flags: list[str], scenario: Callable[[httpx.AsyncClient, Any], Awaitable[Any]]):
    result, _ = _run(flags, scenario, base=["qwen3.6-27b-awq", *QWEN])
    return result


def test_mtp_fills_the_spec_decode_metrics_and_log_line() -> None:
    out = io.StringIO()

    async def scenario(client: httpx.AsyncClient, api: Any) -> str:
        log = VllmLog(api_pid=1, engine_pid=2, stream=out)
        stats = asyncio.create_task(StatsLogger(api.runner, log, interval_s=10.0).run())
        body = _chat(max_tokens=2000, ignore_eos=True)  # > 10 modelled s at MTP acceptance ~2.7
        await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(2)))
        stats.cancel()
        return (await client.get("/metrics")).text

    spec = '{"method":"mtp","num_speculative_tokens":2}'
    metrics = _run_qwen(["--speculative-config", spec, "--time-scale", "500"], scenario)
    drafts = next(
        x for x in metrics.splitlines() if x.startswith("vllm:spec_decode_num_drafts_total")
    )
    assert float(drafts.split()[-1]) > 0
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name=' in metrics
    assert 'position="1"' in metrics
    assert "SpecDecoding metrics: Mean acceptance length: " in out.getvalue()


def test_lmcache_reports_external_prefix_cache_metrics() -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> str:
        words = " ".join(f"w{i}" for i in range(3000))
        body = {"messages": [{"role": "user", "content": words}], "max_tokens": 1}
        for _ in range(2):
            await client.post("/v1/chat/completions", json=body)
        return (await client.get("/metrics")).text

    kv_transfer = '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}'
    metrics = _run_qwen(
        ["--kv-transfer-config", kv_transfer, "--enable-prefix-caching", "--time-scale", "500"],
        scenario,
    )
    queries = next(
        x for x in metrics.splitlines() if x.startswith("vllm:external_prefix_cache_queries_total")
    )
    assert float(queries.split()[-1]) > 0


def test_dev_mode_prefix_cache_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    words = " ".join(f"w{i}" for i in range(400))
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": 1}

    async def scenario(client: httpx.AsyncClient, api: Any) -> list[int]:
        cached = []
        for reset in (False, True):
            await client.post("/v1/chat/completions", json=body)
            if reset:
                assert (await client.post("/reset_prefix_cache")).status_code == 200
            data = (await client.post("/v1/chat/completions", json=body)).json()
            cached.append(data["usage"]["prompt_tokens_details"]["cached_tokens"])
        return cached

    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    cached, _ = _run(["--time-scale", "1000", "--enable-prefix-caching"], scenario)
    assert cached[0] > 0 and cached[1] == 0


def test_tokenize_counts_like_the_generation_endpoints() -> None:
    async def scenario(client: httpx.AsyncClient, api: Any) -> tuple[int, int, int, int]:
        chat = (await client.post("/tokenize", json={"messages": CHAT})).json()
        text = (await client.post("/tokenize", json={"prompt": "one two three"})).json()
        body = _chat(max_tokens=1)
        usage = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
        return chat["count"], len(chat["tokens"]), text["count"], usage["prompt_tokens"]

    (chat_count, chat_ids, text_count, prompt_tokens), _ = _run(["--time-scale", "1000"], scenario)
    assert chat_count == chat_ids == prompt_tokens
    assert text_count == 3
