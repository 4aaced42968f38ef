"""The HTTP driver against a real (stub) server process: the wall clock, time scaling,
the duration deadline and early stops. What each load mode decides is tested once, against
the policy (test_load_policy.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from autotune.replay.load import LoadSpec
from autotune.replay.records import RequestRecord
from autotune.replay.runner import ReplayResult, replay
from autotune.replay.sweep import working_set_tokens
from autotune.workload.plan import WorkloadPlan
from tests.replay.conftest import StubFactory, free_port, make_plan

pytestmark = pytest.mark.timeout(60)


def _replay(url: str, plan: WorkloadPlan, load: LoadSpec, **kwargs: object) -> ReplayResult:
    options: dict[str, object] = {"model_name": "", "scrape_interval_s": 0.1, **kwargs}
    return asyncio.run(replay(url=url, plan=plan, load=load, **options))  # type: ignore[arg-type]


def _by_id(result: ReplayResult) -> dict[str, RequestRecord]:
    return {record.id: record for record in result.records}


def test_concurrency_mode_keeps_n_in_flight_and_matches_server_tokens(stub_url: str) -> None:
    plan = make_plan(sessions=16, output_tokens=8)
    result = _replay(stub_url, plan, LoadSpec(mode="concurrency", concurrency=4))
    assert result.stats.completed == 16 and result.stats.failed == 0
    assert 3 <= result.stats.max_concurrent_requests <= 4
    assert all(record.output_tokens == 8 for record in result.records)
    assert result.server_stats is not None
    assert result.server_stats.generation_tokens == result.stats.total_output_tokens == 128
    assert result.server_stats.peak_running is not None and result.server_stats.peak_running <= 4


def test_sessions_mode_sends_each_turn_after_the_previous_plus_its_gap(stub_url: str) -> None:
    plan = make_plan(sessions=3, turns=3, gap_s=0.1)
    result = _replay(stub_url, plan, LoadSpec(mode="sessions", concurrency=3))
    records = _by_id(result)
    assert len(records) == 9 and result.stats.failed == 0
    for s in range(3):
        for t in range(1, 3):
            previous, current = records[f"s{s}-t{t - 1}"], records[f"s{s}-t{t}"]
            assert previous.e2e_s is not None
            assert current.send_s >= previous.send_s + previous.e2e_s + 0.1 - 0.005
    assert result.stats.max_concurrent_requests >= 2  # sessions overlap


def test_trace_mode_sends_at_scaled_arrivals(stub_url: str) -> None:
    plan = make_plan(sessions=6, arrival_step_s=0.2)
    result = _replay(stub_url, plan, LoadSpec(mode="trace", timing_scale=2.0))
    for i, record in enumerate(sorted(result.records, key=lambda r: r.send_s)):
        assert record.send_s == pytest.approx(i * 0.1, abs=0.04)


def test_server_time_scale_turns_wall_time_into_modelled_time(stub_url: str) -> None:
    plan = make_plan(sessions=1, turns=2, gap_s=1.0)
    started = time.perf_counter()
    result = _replay(stub_url, plan, LoadSpec(mode="sessions"), server_time_scale=10.0)
    assert time.perf_counter() - started < 3.0
    first, second = _by_id(result)["s0-t0"], _by_id(result)["s0-t1"]
    assert first.ttft_s is not None and first.ttft_s >= 0.19  # 20 ms wall x 10
    assert first.e2e_s is not None
    assert second.send_s >= first.send_s + first.e2e_s + 1.0 - 0.05  # a modelled second


def test_duration_with_recycled_sessions_fills_the_time(stub_url: str) -> None:
    plan = make_plan(sessions=2, turns=2)
    load = LoadSpec(mode="sessions", concurrency=2, duration_s=0.6, recycle_sessions=True)
    result = _replay(stub_url, plan, load)
    ids = [record.id for record in result.records]
    assert len(ids) > 4 and any(rid.endswith("#1") for rid in ids)
    assert max(record.send_s for record in result.records) < 0.6
    assert len(set(ids)) == len(ids)


def test_open_loop_backlog_stops_early_as_saturated(stub_server: StubFactory) -> None:
    url = stub_server(ttft_s=0.01, itl_s=0.01, max_running=1)
    plan = make_plan(sessions=400, output_tokens=10, arrival_step_s=0.01)
    started = time.perf_counter()
    result = _replay(url, plan, LoadSpec(mode="trace"), scrape_interval_s=0.1)
    assert result.stats.stopped_early is not None and "saturated" in result.stats.stopped_early
    assert time.perf_counter() - started < 3.5  # before the 4 s of arrivals end
    assert result.server_stats is not None and (result.server_stats.peak_waiting or 0) >= 8


def test_unreachable_server_stops_early() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = _replay(url, make_plan(sessions=40), LoadSpec(mode="concurrency", concurrency=1),
                     model_name="m", scrape_interval_s=None)  # fmt: skip
    assert result.stats.stopped_early is not None and "unreachable" in result.stats.stopped_early
    assert len(result.records) == 20 and result.server_stats is None


def test_working_set_is_the_largest_sessions_side_by_side() -> None:
    plan = make_plan(sessions=3, turns=2)  # prompt_tokens 6 then 12 in every session
    assert working_set_tokens(plan, LoadSpec(mode="sessions", concurrency=2)) == 24
    assert working_set_tokens(plan, LoadSpec(mode="sessions", concurrency=8)) == 36
    assert working_set_tokens(plan, LoadSpec(mode="concurrency")) is None


@pytest.mark.parametrize("endpoint", ["openai.chat", "openai.completions", "anthropic.messages"])
def test_every_endpoint_streams_exact_lengths(stub_url: str, endpoint: str) -> None:
    plan = make_plan(sessions=3, output_tokens=5, endpoint=endpoint)  # type: ignore[arg-type]
    result = _replay(stub_url, plan, LoadSpec(mode="concurrency", concurrency=3))
    assert result.stats.failed == 0
    assert all(r.output_tokens == 5 and r.chunks == 5 for r in result.records)
    assert all(r.prompt_tokens and r.finish_reason for r in result.records)
    assert result.server_stats is not None and result.server_stats.generation_tokens == 15
