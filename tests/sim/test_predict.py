"""In-process prediction: the virtual driver of the load policy, budgets and failures.

What each load mode decides is tested once, against the policy (tests/replay/test_load_policy.py).
"""

from __future__ import annotations

import pytest

from autotune.replay.load import LoadSpec, RequestSlo
from autotune.sim.model.config import SimConfig
from autotune.sim.model.prompt import render_prompt_token_ids
from autotune.sim.model.units import GIB
from autotune.sim.virtual.predict import predict
from autotune.sim.virtual.sweep import baseline_config, closed_loop_sweep
from autotune.vocabulary import FailureClass
from autotune.workload.expand import expand
from autotune.workload.gen import ChatParams, ClaudeCodeParams, chat, claudecode, fixed
from autotune.workload.plan import WorkloadPlan

LLAMA = SimConfig(hardware="h100-80g", model="llama-3.1-8b")
QWEN = baseline_config("rtx4080s-32g", "qwen3.6-27b-awq")


@pytest.fixture(scope="module")
def agent_plan() -> WorkloadPlan:
    return expand(claudecode(ClaudeCodeParams(sessions=4, user_turns=2, requests_per_session=12)))


def test_closed_loop_keeps_concurrency_in_flight() -> None:
    plan = expand(fixed(requests=12, prompt_tokens=200, output_tokens=50))
    prediction = predict(LLAMA, plan, LoadSpec(mode="concurrency", concurrency=3))
    assert prediction.failure is None
    assert len(prediction.records) == 12
    assert all(record.ok and record.output_tokens == 50 for record in prediction.records)
    assert prediction.stats.max_concurrent_requests == 3
    assert prediction.stats.completed == 12
    assert prediction.server_stats.generation_tokens == 12 * 50
    assert prediction.startup is not None and prediction.startup.kv_cache_tokens


def test_records_count_the_prompt_the_server_would_see() -> None:
    plan = expand(fixed(requests=1, prompt_tokens=200, output_tokens=5))
    request = plan.requests[0]
    record = predict(LLAMA, plan, LoadSpec(mode="concurrency", concurrency=1)).records[0]
    expected = render_prompt_token_ids(request.system, request.messages, request.endpoint)
    assert record.prompt_tokens == len(expected)
    assert record.ttft_s is not None and record.e2e_s is not None
    assert 0 < record.ttft_s < record.e2e_s
    assert record.chunks == 5 and record.itl_mean_s is not None


def test_sessions_wait_for_dependencies_and_gaps(agent_plan: WorkloadPlan) -> None:
    load = LoadSpec(mode="sessions", concurrency=4, max_gap_s=5.0)
    prediction = predict(LLAMA, agent_plan, load)
    by_id = {record.id: record for record in prediction.records}
    planned = {request.id: request for request in agent_plan.requests}
    checked = 0
    for record in prediction.records:
        for dependency in planned[record.id].after:
            before = by_id[dependency]
            assert before.e2e_s is not None
            wait_s = min(planned[record.id].gap_s, 5.0)
            assert record.send_s >= before.send_s + before.e2e_s + wait_s - 1e-9
            checked += 1
    assert checked > 0
    assert prediction.stats.max_concurrent_requests >= 2


def test_prefix_caching_hits_on_later_agent_turns(agent_plan: WorkloadPlan) -> None:
    load = LoadSpec(mode="sessions", concurrency=4, max_gap_s=5.0)
    prediction = predict(LLAMA, agent_plan, load)
    stats = prediction.server_stats
    assert stats.prefix_cache_hit_rate is not None and stats.prefix_cache_hit_rate > 0.5
    off = predict(LLAMA.model_copy(update={"enable_prefix_caching": False}), agent_plan, load)
    assert off.stats.ttft.mean is not None and prediction.stats.ttft.mean is not None
    assert off.stats.ttft.mean > prediction.stats.ttft.mean


def test_goodput_counts_requests_meeting_the_slo() -> None:
    plan = expand(fixed(requests=8, prompt_tokens=100, output_tokens=50))
    load = LoadSpec(mode="concurrency", concurrency=8)
    strict = predict(LLAMA, plan, load, slo=RequestSlo(ttft_s=1e-6))
    loose = predict(LLAMA, plan, load, slo=RequestSlo(ttft_s=60.0))
    assert strict.stats.goodput_rps == 0
    assert loose.stats.goodput_rps == pytest.approx(loose.stats.request_throughput_rps)


def test_startup_failure_returns_the_failure_and_no_records() -> None:
    plan = expand(fixed(requests=2, prompt_tokens=10, output_tokens=5))
    config = QWEN.model_copy(update={"kv_cache_memory_bytes": 14 * GIB})
    prediction = predict(config, plan, LoadSpec(mode="concurrency", concurrency=1))
    assert prediction.failure is not None
    assert prediction.failure.failure_class is FailureClass.CUDA_OOM_STARTUP
    assert prediction.records == [] and prediction.startup is None


def test_run_time_oom_on_a_large_first_prompt() -> None:
    plan = expand(fixed(requests=1, prompt_tokens=8000, output_tokens=5))
    config = QWEN.model_copy(update={"kv_cache_memory_bytes": 12 * GIB})
    prediction = predict(config, plan, LoadSpec(mode="concurrency", concurrency=1))
    assert prediction.memory.fits
    assert prediction.failure is not None
    assert prediction.failure.failure_class is FailureClass.CUDA_OOM_LOAD
    assert "CUDA out of memory" in prediction.failure.message


def test_too_long_prompt_is_a_client_error_not_a_crash() -> None:
    plan = expand(fixed(requests=2, prompt_tokens=20_000, output_tokens=5))
    prediction = predict(QWEN, plan, LoadSpec(mode="concurrency", concurrency=1))
    assert prediction.failure is None
    assert [record.http_status for record in prediction.records] == [400, 400]


def test_noise_is_seeded() -> None:
    plan = expand(fixed(requests=4, prompt_tokens=100, output_tokens=40))
    load = LoadSpec(mode="concurrency", concurrency=2)
    first = predict(LLAMA, plan, load, seed=5, noise=0.2).stats.output_throughput_tok_s
    again = predict(LLAMA, plan, load, seed=5, noise=0.2).stats.output_throughput_tok_s
    other = predict(LLAMA, plan, load, seed=6, noise=0.2).stats.output_throughput_tok_s
    assert first == again != other


def test_closed_loop_anchors_from_the_field_notes() -> None:
    rows = closed_loop_sweep(
        QWEN, concurrencies=[1, 32], mtps=[0, 2], prompt_tokens=128, output_tokens=256
    )
    tok_s = {(row.concurrency, row.mtp): row.output_tokens_per_s or 0 for row in rows}
    assert 30 <= tok_s[1, 0] <= 45  # ~37 tok/s at concurrency 1 without MTP
    assert 450 <= tok_s[32, 0] <= 900  # ~700 tok/s aggregate at 32
    assert tok_s[1, 2] > 1.3 * tok_s[1, 0]  # MTP helps a lot at low concurrency
    assert tok_s[32, 2] < 1.1 * tok_s[32, 0]  # ... and not at 32


def test_overload_stops_early_like_the_replayer() -> None:
    plan = expand(chat(ChatParams(requests=1000, rate_rps=20.0, prompt_tokens_median=800)))
    prediction = predict(QWEN, plan, LoadSpec(mode="trace"))
    assert prediction.failure is None
    assert prediction.stats.stopped_early is not None
    assert prediction.stats.stopped_early.startswith("saturated")
    assert len(prediction.records) < 1000
