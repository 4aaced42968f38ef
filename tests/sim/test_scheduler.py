"""The scheduler core: batching limits, chunked prefill, prefix cache, preemption, MTP, OOM."""

from __future__ import annotations

import pytest

from autotune.errors import InputError
from autotune.sim.model.config import SimConfig
from autotune.sim.model.prefix_cache import PrefixCache
from autotune.sim.model.scheduler import (
    CACHE_UNIT_MIN_TOKENS,
    SimEngineCore,
    SimRequest,
    StepResult,
)
from autotune.sim.model.units import GIB


def qwen(**overrides: object) -> SimConfig:
    values: dict[str, object] = {
        "hardware": "rtx4080s-32g",
        "model": "qwen3.6-27b-awq",
        "language_model_only": True,
        "kv_cache_memory_bytes": 9 * GIB,
        "kv_cache_dtype": "fp8_e4m3",
    }
    values.update(overrides)
    return SimConfig.model_validate(values)


def llama(**overrides: object) -> SimConfig:
    values: dict[str, object] = {"hardware": "h100-80g", "model": "llama-3.1-8b"}
    values.update(overrides)
    return SimConfig.model_validate(values)


def prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def run(engine: SimEngineCore) -> list[StepResult]:
    assert engine.memory.fits
    steps = []
    while engine.has_unfinished():
        result = engine.step()
        assert result.oom is None
        steps.append(result)
    return steps


def test_every_request_gets_exactly_its_tokens() -> None:
    engine = SimEngineCore(qwen())
    for index in range(5):
        engine.add_request(SimRequest(f"r{index}", prompt(index * 1000, 100), 20 + index))
    produced: dict[str, int] = {}
    reasons = {}
    for result in run(engine):
        for output in result.outputs:
            produced[output.request_id] = produced.get(output.request_id, 0) + output.new_tokens
            if output.finished:
                reasons[output.request_id] = output.finish_reason
    assert produced == {f"r{index}": 20 + index for index in range(5)}
    assert set(reasons.values()) == {"length"}
    assert engine.counters.generation_tokens == sum(produced.values())
    assert engine.counters.prompt_tokens == 5 * 100


def test_same_seed_same_timeline_and_engines_are_independent() -> None:
    def timeline(seed: int) -> list[float]:
        engine = SimEngineCore(qwen(num_speculative_tokens=2), seed=seed, noise=0.1)
        for index in range(4):
            engine.add_request(SimRequest(f"r{index}", prompt(index * 500, 64), 40))
        return [result.duration_s for result in run(engine)]

    first = timeline(1)
    SimEngineCore(qwen()).add_request(SimRequest("other", prompt(0, 10), 5))
    assert timeline(1) == first
    assert timeline(2) != first


def test_max_num_seqs_caps_the_batch() -> None:
    engine = SimEngineCore(qwen(max_num_seqs=2))
    for index in range(5):
        engine.add_request(SimRequest(f"r{index}", prompt(index * 100, 50), 10))
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, engine.counters.num_running)
    assert peak == 2


def test_chunked_prefill_respects_the_token_budget() -> None:
    engine = SimEngineCore(qwen(max_num_batched_tokens=2048, max_model_len=16384))
    engine.add_request(SimRequest("long", prompt(0, 5000), 4))
    steps = run(engine)
    assert [step.num_prefill_tokens for step in steps[:3]] == [2048, 2048, 904]
    assert not steps[0].outputs and not steps[1].outputs
    assert steps[2].outputs[0].new_tokens == 1


def test_mixed_prefill_and_decode_is_slower_than_pure_decode() -> None:
    engine = SimEngineCore(qwen())
    for index in range(8):
        engine.add_request(SimRequest(f"r{index}", prompt(index * 1000, 100), 200))
    for _ in range(3):
        engine.step()
    pure = engine.step()
    engine.add_request(SimRequest("late", prompt(99_000, 1500), 10))
    mixed = engine.step()
    assert pure.num_prefill_tokens == 0 and mixed.num_prefill_tokens > 0
    assert mixed.duration_s > 2 * pure.duration_s


def test_prefix_cache_hits_whole_blocks_and_honours_salt() -> None:
    engine = SimEngineCore(llama())  # prefix caching on by default, block 16
    shared = prompt(0, 1000)
    engine.add_request(SimRequest("a", shared, 5))
    run(engine)
    engine.add_request(SimRequest("b", [*shared, 7, 8, 9], 5))
    engine.add_request(SimRequest("c", [*shared, 7, 8, 9], 5, cache_salt="other-user"))
    cached = {o.request_id: o.num_cached_tokens for r in run(engine) for o in r.outputs}
    unit = CACHE_UNIT_MIN_TOKENS  # a multiple of the 16-token block
    assert cached["b"] == (1000 // unit) * unit
    assert cached["c"] == 0
    assert engine.counters.prefix_cache_hits == cached["b"]
    assert engine.counters.prefix_cache_queries == 1000 + 2 * 1003


def test_prefix_caching_off_never_hits() -> None:
    engine = SimEngineCore(llama(enable_prefix_caching=False))
    for name in ("a", "b"):
        engine.add_request(SimRequest(name, prompt(0, 1000), 5))
        run(engine)
    assert engine.counters.prefix_cache_hits == 0


def test_hybrid_model_caches_at_attention_block_granularity() -> None:
    engine = SimEngineCore(qwen(enable_prefix_caching=True))
    block = engine.memory.block_size
    engine.add_request(SimRequest("a", prompt(0, 3 * block + 10), 3))
    run(engine)
    engine.add_request(SimRequest("b", prompt(0, 3 * block + 10), 3))
    cached = [o.num_cached_tokens for r in run(engine) for o in r.outputs]
    assert cached[0] == 3 * block


def test_prefix_cache_evicts_least_recently_released_first() -> None:
    cache = PrefixCache()
    for block_hash in (1, 2, 3):
        cache.insert(block_hash)
    cache.release([1])
    cache.release([2, 3])
    assert cache.num_evictable == 3
    cache.acquire([2])
    assert cache.evict(1) == 1
    assert cache.match([1]) == 0 and cache.match([2, 3]) == 2  # 1 went first
    assert cache.evict(5) == 1  # 3 goes; 2 is pinned
    assert cache.match([2]) == 1 and cache.match([3]) == 0


def test_full_pool_preempts_and_everything_still_finishes() -> None:
    engine = SimEngineCore(llama(kv_cache_memory_bytes=GIB, max_model_len=4096))
    assert engine.memory.kv_cache_tokens < 12 * 1000  # the pool cannot hold every request
    for index in range(12):
        engine.add_request(SimRequest(f"r{index}", prompt(index * 10_000, 700), 300))
    produced: dict[str, int] = {}
    for result in run(engine):
        assert 0.0 <= engine.counters.kv_cache_usage <= 1.0
        for output in result.outputs:
            produced[output.request_id] = produced.get(output.request_id, 0) + output.new_tokens
    assert engine.counters.num_preemptions > 0
    assert produced == {f"r{index}": 300 for index in range(12)}


def test_mtp_counters_and_speed_up_at_low_concurrency() -> None:
    def finish_time(k: int) -> tuple[float, SimEngineCore]:
        engine = SimEngineCore(qwen(num_speculative_tokens=k), seed=3)
        engine.add_request(SimRequest("solo", prompt(0, 128), 256))
        run(engine)
        return engine.clock_s, engine

    plain_s, _ = finish_time(0)
    mtp_s, engine = finish_time(2)
    counters = engine.counters
    assert mtp_s < 0.85 * plain_s
    assert 0 < counters.spec_decode_num_accepted_tokens <= counters.spec_decode_num_draft_tokens
    assert counters.spec_decode_num_draft_tokens == 2 * counters.spec_decode_num_drafts
    first, second = counters.spec_decode_accepted_per_pos
    assert first >= second > 0


def test_perfect_acceptance_emits_k_plus_one_tokens_per_step() -> None:
    engine = SimEngineCore(qwen(num_speculative_tokens=3), mtp_acceptance=[1.0, 1.0, 1.0])
    engine.add_request(SimRequest("solo", prompt(0, 64), 41))
    tokens = [o.new_tokens for r in run(engine) for o in r.outputs]
    assert tokens == [1] + [4] * 10


def test_large_prefill_without_headroom_ooms_at_run_time() -> None:
    engine = SimEngineCore(qwen(kv_cache_memory_bytes=12 * GIB))
    assert engine.memory.fits
    engine.add_request(SimRequest("big", prompt(0, 8000), 10))
    result = engine.step()
    assert result.oom is not None and "CUDA out of memory" in result.oom
    assert engine.step().oom == result.oom  # the engine stays dead


def test_abort_frees_blocks() -> None:
    engine = SimEngineCore(llama(enable_prefix_caching=False))
    engine.add_request(SimRequest("gone", prompt(0, 3000), 100))
    engine.step()
    assert engine.counters.kv_cache_usage > 0
    engine.abort("gone")
    assert not engine.has_unfinished()
    assert engine.counters.kv_cache_usage == 0


def test_prompt_longer_than_the_context_is_rejected() -> None:
    engine = SimEngineCore(qwen())
    with pytest.raises(InputError, match="maximum context length is 16384"):
        engine.add_request(SimRequest("huge", prompt(0, 20_000), 10))


def test_advance_to_never_goes_back() -> None:
    engine = SimEngineCore(qwen())
    engine.advance_to(5.0)
    engine.advance_to(2.0)
    assert engine.clock_s == 5.0


def test_lmcache_serves_a_repeated_prefix_from_host_memory() -> None:
    engine = SimEngineCore(qwen(lmcache=True, kv_cache_memory_bytes=8 * GIB))
    assert not engine.memory.enable_prefix_caching  # no GPU prefix cache at all
    block = engine.memory.block_size

    def first_token_s(name: str) -> tuple[float, int]:
        start_s = engine.clock_s
        engine.add_request(SimRequest(name, prompt(0, 8000), 2))
        for result in run(engine):
            if result.outputs:
                return result.start_s + result.duration_s - start_s, result.outputs[
                    0
                ].num_cached_tokens
        raise AssertionError("no output")

    cold_s, cold_cached = first_token_s("cold")
    warm_s, warm_cached = first_token_s("warm")
    assert cold_cached == 0 and warm_cached == (7999 // block) * block
    assert warm_s < 0.3 * cold_s
    assert engine.counters.external_prefix_cache_hits == warm_cached
    assert engine.counters.prefix_cache_hits == 0


@pytest.mark.parametrize("mtp", [0, 2])
def test_decode_runs_equal_step_by_step(mtp: int) -> None:
    def drive(fast: bool) -> tuple[float, dict[str, int], dict[str, object]]:
        engine = SimEngineCore(llama(num_speculative_tokens=mtp), seed=11, noise=0.05)
        for index in range(6):
            engine.add_request(SimRequest(f"r{index}", prompt(index * 900, 300), 50 + 9 * index))
        tokens: dict[str, int] = {}
        runs = 0
        while engine.has_unfinished():
            decoded = engine.decode_run(float("inf")) if fast else None
            if decoded is not None:
                runs += 1
                for request_id, count in zip(decoded.request_ids, decoded.tokens, strict=True):
                    tokens[request_id] = tokens.get(request_id, 0) + count
                continue
            for output in engine.step().outputs:
                tokens[output.request_id] = tokens.get(output.request_id, 0) + output.new_tokens
        assert runs > 0 or not fast
        return engine.clock_s, tokens, vars(engine.counters)

    fast = drive(True)
    slow = drive(False)
    assert fast[0] == slow[0]  # the same floats: a run adds its steps as step() does
    assert fast[1] == slow[1] == {f"r{index}": 50 + 9 * index for index in range(6)}
    assert fast[2] == slow[2]


def test_a_prefill_chunk_computes_logits_only_where_it_samples() -> None:
    """vLLM runs the lm_head at logits_indices: a bigger vocabulary costs a mid-prompt chunk
    nothing, and costs every verify token of a decode step."""
    from autotune.catalog.hardware import get_gpu
    from autotune.catalog.models import get_model
    from autotune.sim.model.memory import plan_memory
    from autotune.sim.model.timing import RooflineTimeModel, StepShape

    config = qwen()
    model = get_model(config.model)
    extra = 9 * model.vocab_size * model.hidden_size  # a 10x vocabulary's lm_head
    big_vocab = model.model_copy(
        update={"vocab_size": 10 * model.vocab_size, "matmul_params": model.matmul_params + extra}
    )
    chunk = StepShape(
        num_seqs=1, num_prefill_tokens=2048, num_decode_tokens=0, context_tokens=0,
        attention_pairs=2048 * 1024, num_output_seqs=0, num_logit_tokens=0,
    )  # fmt: skip
    verify = StepShape(
        num_seqs=32, num_prefill_tokens=0, num_decode_tokens=128, context_tokens=32 * 256,
        attention_pairs=128 * 256, num_spec_seqs=32, num_draft_passes=3,
    )  # fmt: skip
    times = {}
    for name, spec in (("catalog", model), ("big vocabulary", big_vocab)):
        timing = RooflineTimeModel(
            get_gpu(config.hardware), spec, plan_memory(config), enforce_eager=False
        )
        times[name] = (timing.step_time_s(chunk), timing.step_time_s(verify))
    assert times["big vocabulary"][0] == pytest.approx(times["catalog"][0], rel=1e-9)
    assert times["big vocabulary"][1] > 1.2 * times["catalog"][1]
