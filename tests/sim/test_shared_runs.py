"""One replay answers every KV pool that would not have bounded it, and no other."""

from __future__ import annotations

import pytest

from autotune.replay.load import LoadSpec
from autotune.sim.model.config import SimConfig
from autotune.sim.model.units import GIB
from autotune.sim.virtual.predict import Prediction, predict
from autotune.sim.virtual.shared_runs import SharedRuns
from autotune.sim.virtual.sweep import baseline_config
from autotune.workload.expand import expand
from autotune.workload.gen import ClaudeCodeParams, claudecode
from autotune.workload.plan import WorkloadPlan

QWEN = baseline_config("rtx4080s-32g", "qwen3.6-27b-awq").model_copy(update={"max_num_seqs": 8})


@pytest.fixture(scope="module")
def plan() -> WorkloadPlan:
    return expand(claudecode(ClaudeCodeParams(sessions=4, user_turns=2, requests_per_session=12)))


def pool(gib: float) -> SimConfig:
    return QWEN.model_copy(update={"kv_cache_memory_bytes": int(gib * GIB)})


def alone(config: SimConfig, plan: WorkloadPlan) -> Prediction:
    return predict(config, plan, LoadSpec(), shared=SharedRuns())


def test_a_pool_that_never_bounds_the_replay_takes_its_answer(plan: WorkloadPlan) -> None:
    shared = SharedRuns()
    predict(pool(10.0), plan, LoadSpec(), shared=shared)
    got = predict(pool(1.5), plan, LoadSpec(), shared=shared)
    assert shared.hits == 1
    assert got.model_dump() == alone(pool(1.5), plan).model_dump()  # its own memory, KV usage
    assert got.memory.kv_cache_tokens < predict(pool(10.0), plan, LoadSpec()).memory.kv_cache_tokens


def test_a_pool_too_small_for_the_replay_is_replayed(plan: WorkloadPlan) -> None:
    shared = SharedRuns()
    predict(pool(10.0), plan, LoadSpec(), shared=shared)
    got = predict(pool(1.0), plan, LoadSpec(), shared=shared)
    assert shared.hits == 0
    assert got.server_stats.preemptions > 0  # it evicts and preempts where 10 GiB did not
    assert got.model_dump() == alone(pool(1.0), plan).model_dump()


def test_another_load_is_another_replay(plan: WorkloadPlan) -> None:
    shared = SharedRuns()
    predict(pool(10.0), plan, LoadSpec(), shared=shared)
    predict(pool(6.0), plan, LoadSpec(mode="sessions", concurrency=2), shared=shared)
    assert shared.hits == 0


def test_seats_it_never_filled_take_its_answer_and_fewer_do_not(plan: WorkloadPlan) -> None:
    shared = SharedRuns()
    predict(pool(10.0), plan, LoadSpec(), shared=shared)  # max_num_seqs 8: 4 sessions fit
    more = pool(6.0).model_copy(update={"max_num_seqs": 16})
    got = predict(more, plan, LoadSpec(), shared=shared)
    assert shared.hits == 1
    assert got.model_dump() == alone(more, plan).model_dump()
    fewer = pool(6.0).model_copy(update={"max_num_seqs": 1})
    got = predict(fewer, plan, LoadSpec(), shared=shared)
    assert shared.hits == 1  # 1 seat: a session waits where 8 let it in
    assert got.model_dump() == alone(fewer, plan).model_dump()
    assert (
        got.stats.output_throughput_tok_s
        != predict(more, plan, LoadSpec()).stats.output_throughput_tok_s
    )
