"""Tensor parallelism on one node: memory per rank, step time, flags and startup log."""

from __future__ import annotations

import pytest

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.engines.vllm_log import parse_startup_log
from autotune.errors import InputError
from autotune.sim.model.config import SimConfig
from autotune.sim.model.memory import plan_memory
from autotune.sim.model.timing import RooflineTimeModel, StepShape
from autotune.sim.server.flags import parse_serve_args
from tests.sim.test_logs import _startup_log

KV_BYTES = 8 * 2**30


def _memory(model: str, tp: int, hardware: str = "h100-80g"):
    config = SimConfig(
        model=model,
        hardware=hardware,
        kv_cache_memory_bytes=KV_BYTES,
        max_model_len=8192,
        tensor_parallel_size=tp,
    )
    return plan_memory(config)


@pytest.mark.parametrize("model", ["qwen3-32b-awq", "qwen3.6-27b-awq"])
def test_tp2_halves_weights_and_doubles_kv_tokens_for_the_same_kv_bytes(model: str) -> None:
    one, two = _memory(model, 1), _memory(model, 2)
    assert one.fits and two.fits
    assert two.weights_bytes == one.weights_bytes // 2
    # Half the KV heads a rank: a block of half the bytes, twice the blocks in the same pool.
    assert two.bytes_per_block * 2 == one.bytes_per_block
    assert two.num_gpu_blocks == 2 * one.num_gpu_blocks
    assert two.kv_cache_tokens == pytest.approx(2 * one.kv_cache_tokens, rel=0.001)
    assert two.peak_activation_bytes == one.peak_activation_bytes  # per rank, as before


def test_tp_must_divide_the_attention_heads() -> None:
    heads = get_model("qwen3-32b-awq").num_attention_heads
    with pytest.raises(InputError, match=rf"attention heads \({heads}\) must be divisible"):
        _memory("qwen3-32b-awq", 3)


def test_tp_must_divide_the_kv_heads_or_be_a_multiple_of_them() -> None:
    """vLLM's QKVParallelLinear splits or replicates the KV heads; Qwen3.6's 4 with TP 3
    (24 attention heads: divisible) it can do neither. Before: the simulator started it."""
    with pytest.raises(InputError, match="4 KV heads"):
        _memory("qwen3.6-27b-awq", 3)
    assert _memory("qwen3.6-27b-awq", 8).fits  # 8 = 2 x 4: each KV head on two ranks


def _decode_step_s(model: str, tp: int, hardware: str, num_seqs: int) -> float:
    memory = _memory(model, tp, hardware)
    timing = RooflineTimeModel(get_gpu(hardware), get_model(model), memory, enforce_eager=False)
    context = 4000
    step = StepShape(
        num_seqs=num_seqs, num_prefill_tokens=0, num_decode_tokens=num_seqs,
        context_tokens=num_seqs * context, attention_pairs=num_seqs * context,
    )  # fmt: skip
    return timing.step_time_s(step)


@pytest.mark.parametrize("num_seqs", [1, 32, 256])
def test_tp2_decode_step_is_faster_on_h100_but_not_twice(num_seqs: int) -> None:
    one = _decode_step_s("qwen3-32b-awq", 1, "h100-80g", num_seqs)
    two = _decode_step_s("qwen3-32b-awq", 2, "h100-80g", num_seqs)
    assert one / 2 < two < one


def test_all_reduces_over_pcie_eat_more_of_the_gain_than_over_nvlink() -> None:
    """The same H100 with a PCIe link instead of NVLink: a slower TP-2 step, TP 1 unchanged."""
    memory = {tp: _memory("qwen3-32b-awq", tp) for tp in (1, 2)}
    nvlink = get_gpu("h100-80g")
    pcie = nvlink.model_copy(
        update={
            "interconnect_bytes_s": get_gpu("l40s-48g").interconnect_bytes_s,
            "interconnect_latency_s": get_gpu("l40s-48g").interconnect_latency_s,
        }
    )
    step = StepShape(
        num_seqs=64, num_prefill_tokens=0, num_decode_tokens=64,
        context_tokens=64 * 4000, attention_pairs=64 * 4000,
    )  # fmt: skip
    times = {
        (gpu.interconnect_bytes_s, tp): RooflineTimeModel(
            gpu, get_model("qwen3-32b-awq"), memory[tp], enforce_eager=False
        ).step_time_s(step)
        for gpu in (nvlink, pcie)
        for tp in (1, 2)
    }
    nv, pc = nvlink.interconnect_bytes_s, pcie.interconnect_bytes_s
    assert times[(nv, 1)] == times[(pc, 1)]
    assert times[(nv, 2)] < times[(pc, 2)]


def test_flag_parses_and_a_node_bounds_it(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["qwen3-32b-awq", "--hardware", "h100-80g"]
    assert parse_serve_args([*base, "-tp", "2"]).sim.tensor_parallel_size == 2
    assert parse_serve_args(base).sim.tensor_parallel_size == 1
    with pytest.raises(SystemExit) as excinfo:
        parse_serve_args([*base, "--tensor-parallel-size", "16"])
    assert excinfo.value.code == 2
    assert "at most 8 GPUs" in capsys.readouterr().err


def test_startup_log_says_the_tp_size_and_the_per_rank_plan() -> None:
    text, memory = _startup_log(
        ["qwen3-32b-awq", "--hardware", "h100-80g", "--tensor-parallel-size", "2",
         "--max-model-len", "8192"]
    )  # fmt: skip
    assert "tensor_parallel_size=2," in text
    report = parse_startup_log(text)
    assert report.kv_cache_tokens == memory.kv_cache_tokens
    assert memory.weights_bytes == _memory("qwen3-32b-awq", 2).weights_bytes
