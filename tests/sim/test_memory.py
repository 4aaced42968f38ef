"""The memory plan against the field notes' measurements and vLLM's own arithmetic."""

from __future__ import annotations

import re

import pytest

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.errors import InputError
from autotune.sim.model.config import SimConfig
from autotune.sim.model.kv_layout import plan_layout
from autotune.sim.model.memory import batch_defaults, plan_memory
from autotune.sim.model.units import GIB

CARD = "rtx4080s-32g"
QWEN = "qwen3.6-27b-awq"


def qwen(**overrides: object) -> SimConfig:
    values: dict[str, object] = {"hardware": CARD, "model": QWEN, "language_model_only": True}
    values.update(overrides)
    return SimConfig.model_validate(values)


@pytest.mark.parametrize(
    ("dtype", "field_notes_tokens"), [("auto", 128_341), ("fp8_e4m3", 220_013)]
)
def test_kv_capacity_matches_field_notes(dtype: str, field_notes_tokens: int) -> None:
    report = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB, kv_cache_dtype=dtype))
    assert report.fits
    assert report.kv_cache_tokens == pytest.approx(field_notes_tokens, rel=0.02)


def test_fp8_does_not_double_capacity_on_the_hybrid_model() -> None:
    bf16 = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB)).kv_cache_tokens
    fp8 = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB, kv_cache_dtype="fp8")).kv_cache_tokens
    assert 1.4 < fp8 / bf16 < 1.9


def test_hybrid_block_size_is_aligned_to_the_mamba_page() -> None:
    report = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB))
    assert report.attention_block_size == report.block_size == 784
    assert report.block_size % 16 == 0
    assert 0 <= report.mamba_page_padding_pct < 2


def test_startup_memory_lines_match_field_notes() -> None:
    report = plan_memory(qwen(gpu_memory_utilization=0.8))
    assert round(report.weights_bytes / GIB, 2) == 18.33
    assert round(report.peak_activation_bytes / GIB, 2) == 2.47
    assert round(report.non_torch_bytes / GIB, 2) == 0.11
    assert round(report.cudagraph_bytes / GIB, 2) == 0.51
    assert report.kv_cache_bytes / GIB == pytest.approx(3.74, abs=0.02)
    # "--kv-cache-memory=10206990336 (9.51 GiB) to fully utilize gpu memory"
    assert report.suggested_kv_cache_bytes == pytest.approx(10_206_990_336, rel=0.002)


def test_vision_tower_costs_about_a_gib() -> None:
    with_tower = plan_memory(qwen(language_model_only=False, gpu_memory_utilization=0.8))
    assert round(with_tower.weights_bytes / GIB, 1) == 19.2
    assert round(with_tower.peak_activation_bytes / GIB, 2) == 1.89


def test_kv_ceiling_is_about_13g_without_mtp_or_lmcache() -> None:
    assert plan_memory(qwen(kv_cache_memory_bytes=13 * 10**9)).fits  # "13g"
    too_big = plan_memory(qwen(kv_cache_memory_bytes=13 * GIB))
    assert not too_big.fits
    assert too_big.failure_class == "cuda-oom-startup"
    assert "CUDA out of memory" in (too_big.failure_message or "")


@pytest.mark.parametrize("extra", [{"num_speculative_tokens": 2}, {"lmcache": True}])
def test_mtp_and_lmcache_lower_the_ceiling(extra: dict[str, object]) -> None:
    assert plan_memory(qwen(kv_cache_memory_bytes=12 * GIB)).fits
    assert not plan_memory(qwen(kv_cache_memory_bytes=12 * GIB, **extra)).fits


def test_mtp_costs_kv_capacity() -> None:
    plain = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB)).kv_cache_tokens
    mtp = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB, num_speculative_tokens=3))
    assert mtp.kv_cache_tokens < plain
    assert mtp.state_blocks_per_request > 3


def test_kv_does_not_fit_uses_vllms_text() -> None:
    report = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB, max_model_len=262_144))
    assert report.failure_class == "kv-does-not-fit"
    pattern = r"To serve at least one request with the models?'s max seq len \((\d+)\)"
    match = re.search(pattern, report.failure_message or "")
    assert match is not None and match.group(1) == "262144"
    estimate = re.search(r"maximum model length is (\d+)", report.failure_message or "")
    assert estimate is not None and 0 < int(estimate.group(1)) < 262_144


def test_no_memory_left_for_the_cache() -> None:
    report = plan_memory(qwen(gpu_memory_utilization=0.65))
    assert report.failure_class == "kv-does-not-fit"
    assert "No available memory for the cache blocks" in (report.failure_message or "")


def test_utilization_above_free_memory_fails_at_startup() -> None:
    report = plan_memory(qwen(gpu_memory_utilization=1.0))
    assert report.failure_class == "cuda-oom-startup"
    assert "less than desired GPU memory utilization" in (report.failure_message or "")


def test_dense_model_capacity_is_blocks_times_block_size() -> None:
    config = SimConfig(hardware="h100-80g", model="llama-3.1-8b", kv_cache_memory_bytes=20 * GIB)
    report = plan_memory(config)
    per_token = 2 * 8 * 128 * 2 * 32  # K+V, 8 KV heads, head_dim 128, bf16, 32 layers
    assert report.block_size == 16
    assert report.num_gpu_blocks == 20 * GIB // (16 * per_token)
    assert report.kv_cache_tokens == report.num_gpu_blocks * 16


def test_activation_grows_with_batched_tokens_and_graphs_with_capture_sizes() -> None:
    small = plan_memory(qwen(max_num_batched_tokens=2048, kv_cache_memory_bytes=9 * GIB))
    large = plan_memory(qwen(max_num_batched_tokens=8192, kv_cache_memory_bytes=9 * GIB))
    assert large.peak_activation_bytes > small.peak_activation_bytes
    few = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB, cudagraph_capture_sizes=(1, 2, 4, 8)))
    assert few.cudagraph_bytes < small.cudagraph_bytes
    eager = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB, enforce_eager=True))
    assert eager.cudagraph_bytes == 0 and eager.cudagraph_capture_sizes == []


def test_vllm_batch_defaults_by_hardware() -> None:
    assert batch_defaults(get_gpu("h100-80g")) == (8192, 1024)
    assert batch_defaults(get_gpu("a100-80g")) == (2048, 256)
    assert batch_defaults(get_gpu(CARD)) == (2048, 256)
    report = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB))
    assert (report.max_num_batched_tokens, report.max_num_seqs) == (2048, 256)


def test_prefix_caching_default_follows_the_model() -> None:
    assert not plan_memory(qwen(kv_cache_memory_bytes=9 * GIB)).enable_prefix_caching
    llama = SimConfig(hardware="h100-80g", model="llama-3.1-8b")
    assert plan_memory(llama).enable_prefix_caching


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"hardware": "tpu-v9"}, "rtx4080s-32g"),
        ({"model": "gpt-9"}, "qwen3.6-27b-awq"),
        ({"kv_cache_dtype": "fp7"}, "Invalid kv_cache_dtype"),
        ({"max_model_len": 10**6}, "max_model_len"),
        ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "must be greater than or equal"),
    ],
)
def test_rejected_configurations_name_the_problem(
    overrides: dict[str, object], needle: str
) -> None:
    with pytest.raises(InputError, match=needle):
        plan_memory(qwen(**overrides))


def test_speculation_needs_a_draft_head() -> None:
    with pytest.raises(InputError, match="speculative"):
        plan_memory(SimConfig(hardware="h100-80g", model="qwen3-32b-awq", num_speculative_tokens=1))


def test_hopper_aligns_hybrid_blocks_to_the_gdn_prefill_checkpoint() -> None:
    ada = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB, enable_prefix_caching=True))
    hopper = plan_memory(
        SimConfig(
            hardware="h100-80g",
            model=QWEN,
            kv_cache_memory_bytes=9 * GIB,
            enable_prefix_caching=True,
        )
    )
    assert ada.block_size == 784  # 16 x 49
    assert hopper.block_size == 832  # lcm(16, 64) = 64 -> 64 x 13


def test_packed_kv_dtypes_hold_more_tokens_than_fp8() -> None:
    llama = {"hardware": "h100-80g", "model": "llama-3.1-8b", "kv_cache_memory_bytes": 8 * GIB}
    fp8 = plan_memory(SimConfig.model_validate({**llama, "kv_cache_dtype": "fp8"}))
    packed = plan_memory(SimConfig.model_validate({**llama, "kv_cache_dtype": "turboquant_k8v4"}))
    bf16 = plan_memory(SimConfig.model_validate(llama))
    assert fp8.kv_cache_tokens == pytest.approx(2 * bf16.kv_cache_tokens, rel=0.01)
    assert packed.kv_cache_tokens > 1.25 * fp8.kv_cache_tokens


def test_mtp_draft_layer_joins_the_attention_group() -> None:
    model = get_model(QWEN)
    plain = plan_layout(
        model,
        kv_cache_dtype="auto",
        num_speculative_tokens=0,
        enable_prefix_caching=False,
        block_size=None,
        gdn_checkpoint_align=False,
    )
    mtp = plan_layout(
        model,
        kv_cache_dtype="auto",
        num_speculative_tokens=2,
        enable_prefix_caching=True,
        block_size=None,
        gdn_checkpoint_align=False,
    )
    assert (plain.group_size, plain.num_attention_groups, plain.num_state_groups) == (16, 1, 3)
    assert plain.state_blocks_per_request == 3  # 1 block per GDN group without prefix caching
    assert (mtp.group_size, mtp.num_attention_groups, mtp.num_state_groups) == (17, 1, 3)
    assert mtp.state_blocks_per_request == 3 * (2 + 2)  # align mode: 2 + k per group
    assert mtp.bytes_per_block == 17 * mtp.page_bytes
