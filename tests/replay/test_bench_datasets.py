"""`vllm bench serve`'s datasets and arrivals as a plan: the lengths the server counts, the
arrival process, ShareGPT's sampling rules, and the load each flag combination means."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from autotune.errors import InputError, WorkloadError
from autotune.replay.bench_datasets import BenchDataset, arrival_times_s, bench_plan
from autotune.replay.bench_serve import bench_load, serving_result
from autotune.replay.records import Percentiles, ReplayStats
from autotune.sim.model.prompt import PromptRenderer


def test_random_prompts_are_the_drawn_lengths_as_the_simulated_server_counts_them() -> None:
    dataset = BenchDataset(
        num_prompts=200, random_input_len=300, random_output_len=40, random_range_ratio=0.5,
        random_prefix_len=16, ignore_eos=True, seed=3,
    )  # fmt: skip
    plan = bench_plan(dataset)
    renderer = PromptRenderer()
    served = [len(renderer.planned_array(request)) for request in plan.requests]
    inputs = np.array(served) - 16 - 1  # the prefix, and the newline after it
    assert inputs.min() >= 150 and inputs.max() <= 450 and len(set(inputs)) > 50
    assert abs(inputs.mean() - 300) < 15
    outputs = [request.output_tokens for request in plan.requests]
    assert min(outputs) >= 20 and max(outputs) <= 60
    assert all(request.exact_output for request in plan.requests)
    assert all(request.endpoint == "openai.completions" for request in plan.requests)
    # Unique prompts after the shared prefix: nothing else for a prefix cache to find.
    texts = {request.messages[-1].text for request in plan.requests}
    assert len(texts) == 200
    same_seed = bench_plan(dataset)
    assert [r.output_tokens for r in same_seed.requests] == outputs
    other = bench_plan(BenchDataset(**{**dataset.__dict__, "seed": 4}))
    assert [r.output_tokens for r in other.requests] != outputs


def test_fixed_lengths_are_exact_and_without_ignore_eos_the_output_is_a_limit() -> None:
    plan = bench_plan(BenchDataset(num_prompts=5, random_input_len=1024, random_output_len=128))
    renderer = PromptRenderer()
    assert [len(renderer.planned_array(r)) for r in plan.requests] == [1024] * 5
    assert [r.output_tokens for r in plan.requests] == [128] * 5
    assert not any(r.exact_output for r in plan.requests)


def test_arrivals_are_poisson_at_the_rate_and_end_at_num_prompts_over_rate() -> None:
    times = np.array(arrival_times_s(2000, 8.0, burstiness=1.0, seed=0))
    assert times[-1] == pytest.approx(2000 / 8.0)
    gaps = np.diff(times)
    assert gaps.min() >= 0 and abs(gaps.mean() - 1 / 8.0) < 0.01
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1  # exponential: cv 1
    smooth = np.diff(arrival_times_s(2000, 8.0, burstiness=4.0, seed=0))
    assert abs(smooth.std() / smooth.mean() - 0.5) < 0.1  # gamma shape 4: cv 1/2
    assert arrival_times_s(3, math.inf, burstiness=1.0, seed=0) == [0.0, 0.0, 0.0]
    plan = bench_plan(BenchDataset(num_prompts=50, random_input_len=8), request_rate=5.0)
    assert plan.requests[-1].arrival_s == pytest.approx(10.0, abs=1e-5)


def _conversation(prompt_words: int, reply_words: int) -> dict[str, object]:
    return {
        "conversations": [
            {"from": "human", "value": " ".join(["ask"] * prompt_words)},
            {"from": "gpt", "value": " ".join(["say"] * reply_words)},
        ]
    }


def test_sharegpt_takes_first_turns_within_vllms_length_limits(tmp_path: Path) -> None:
    data = [
        _conversation(10, 20),  # kept
        _conversation(2, 20),  # prompt under 4 tokens
        _conversation(10, 2),  # output under 4 tokens
        _conversation(1100, 10),  # prompt over 1024
        _conversation(900, 1200),  # prompt + output over 2048
        {"conversations": [{"from": "human", "value": "one turn only"}]},
        _conversation(30, 40),  # kept
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    plan = bench_plan(BenchDataset(name="sharegpt", num_prompts=10, dataset_path=path))
    assert sorted(r.output_tokens for r in plan.requests) == [20, 40]
    fixed = bench_plan(
        BenchDataset(name="sharegpt", num_prompts=10, dataset_path=path, sharegpt_output_len=2)
    )
    # A fixed output length skips the output check, and the 900-token prompt then fits.
    assert len(fixed.requests) == 4 and {r.output_tokens for r in fixed.requests} == {2}
    one = bench_plan(BenchDataset(name="sharegpt", num_prompts=1, dataset_path=path))
    assert len(one.requests) == 1
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(WorkloadError, match=r"bad\.json: ShareGPT must be a JSON array"):
        bench_plan(BenchDataset(name="sharegpt", dataset_path=tmp_path / "bad.json"))
    with pytest.raises(InputError, match="--dataset-path"):
        bench_plan(BenchDataset(name="sharegpt"))


def test_each_flag_combination_is_the_load_vllm_runs() -> None:
    closed = bench_load(num_prompts=100, max_concurrency=16, request_rate=math.inf)
    assert (closed.mode, closed.concurrency, closed.saturation_stop) == ("concurrency", 16, False)
    burst = bench_load(num_prompts=100, max_concurrency=None, request_rate=math.inf)
    assert (burst.mode, burst.concurrency) == ("concurrency", 100)
    capped = bench_load(num_prompts=100, max_concurrency=8, request_rate=4.0)
    assert (capped.mode, capped.max_in_flight, capped.max_gap_s) == ("trace", 8, None)
    assert bench_load(num_prompts=100, max_concurrency=None, request_rate=4.0).max_in_flight is None


def test_the_summary_is_vllms_block_with_its_labels() -> None:
    ms = Percentiles(mean=0.02, p50=0.019, p90=0.03, p95=0.031, p99=0.04)
    stats = ReplayStats(
        duration_s=12.5, completed=100, failed=0, total_input_tokens=102400,
        total_output_tokens=12800, request_throughput_rps=8.0, output_throughput_tok_s=1024.0,
        total_token_throughput_tok_s=9216.0, ttft=ms, tpot=ms, itl=ms, max_concurrent_requests=4,
    )  # fmt: skip
    lines = serving_result(stats, max_concurrency=4, request_rate=2.0)
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert "Maximum request concurrency:             4         " in lines
    assert "Request rate configured (RPS):           2.00      " in lines
    assert "Output token throughput (tok/s):         1024.00   " in lines
    assert "Median TTFT (ms):                        19.00     " in lines
    assert "P99 ITL (ms):                            40.00     " in lines
    assert not any("Request rate" in line for line in serving_result(
        stats, max_concurrency=None, request_rate=math.inf
    ))  # fmt: skip
