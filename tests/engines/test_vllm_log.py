from __future__ import annotations

import pytest

from autotune.engines.vllm_log import (
    classify_failure,
    fatal_line,
    parse_engine_stats,
    parse_startup_log,
)
from autotune.vocabulary import FailureClass

SUCCESS_LOGS = [
    "run3_fp8.log",
    "run5_eager.log",
    "run9_preempt.log",
    "run10_sigterm.log",
    "run12_sigkill.log",
    "run13_venv2.log",
    "t8_nvfp4.log",
]


@pytest.mark.parametrize("name", SUCCESS_LOGS)
def test_real_cpu_startup_logs_parse(real_log, name):
    report = parse_startup_log(real_log(name))
    assert report.engine_version == "0.32.0"
    assert report.device == "CPU"
    assert report.max_concurrency_tokens_per_request == 1024
    assert report.kv_cache_tokens == pytest.approx(report.max_concurrency * 1024)
    assert report.model_load_s is not None
    assert report.kv_cache_gib is not None


def test_real_cpu_capacity_values(real_log):
    assert parse_startup_log(real_log("run5_eager.log")).kv_cache_tokens == 524_288
    fp8 = parse_startup_log(real_log("run3_fp8.log"))
    assert fp8.kv_cache_tokens == 1_048_576
    assert fp8.max_concurrency == 1024.0
    assert fp8.kv_cache_gib == 0.25
    preempt = parse_startup_log(real_log("run9_preempt.log"))
    assert preempt.kv_cache_tokens == 2048
    assert preempt.kv_cache_gib == 0.0


def test_gpu_033_memory_summary(fixture_log):
    report = parse_startup_log(fixture_log("gpu_startup_033.log"))
    assert report.engine_version == "0.33.0"
    assert report.device == "GPU"
    assert report.kv_cache_tokens == 53_312
    assert report.max_concurrency == 1.42
    assert report.max_concurrency_tokens_per_request == 262_144
    assert report.attention_block_size == 544
    assert report.weights_gib == 18.33
    assert report.model_load_s == pytest.approx(21.402113)
    assert report.peak_activation_gib == 2.47
    assert report.non_torch_gib == pytest.approx(0.11)  # 18.44 consumed - 18.33 weights
    assert report.cudagraph_gib == 0.51
    assert report.graph_capture_s == 8
    assert report.kv_cache_gib == 3.74


def test_gpu_026_memory_summary_and_two_line_capacity(fixture_log):
    report = parse_startup_log(fixture_log("gpu_startup_026.log"))
    assert report.engine_version == "0.26.0"
    assert report.kv_cache_tokens == 128_341
    assert report.max_concurrency == 1.96
    assert report.attention_block_size == 528
    assert report.weights_gib == 18.33
    assert report.non_torch_gib == 0.11
    assert report.peak_activation_gib == 2.47
    assert report.cudagraph_gib == 0.52  # the capture line (actual) wins over the estimate
    assert report.kv_cache_gib == 3.74


def test_partial_log_leaves_fields_unset():
    report = parse_startup_log("INFO:     Started server process [1]\n")
    assert report.kv_cache_tokens is None
    assert report.engine_version is None


def test_engine_stats_lines(real_log, fixture_log):
    stats = parse_engine_stats(real_log("run9_preempt.log"))
    assert stats[0].running == 3
    assert stats[0].waiting == 1
    assert stats[0].kv_cache_usage == pytest.approx(0.867)
    assert stats[0].prefix_cache_hit_rate == 0.0
    gpu = parse_engine_stats(fixture_log("gpu_startup_033.log"))
    assert [s.external_prefix_cache_hit_rate for s in gpu] == [None, pytest.approx(0.063)]


@pytest.mark.parametrize(
    ("name", "exit_code", "expected", "needle"),
    [
        ("fail1_kv1000.log", 1, FailureClass.KV_DOES_NOT_FIT, "No available memory"),
        ("fail2_kv256k.log", 1, FailureClass.KV_DOES_NOT_FIT, "To serve at least one request"),
        ("fail3_mml4096.log", 1, FailureClass.UNSUPPORTED_CONFIG, "validation error"),
        ("fail4_default_gmu.log", 1, FailureClass.CUDA_OOM_STARTUP, "memory utilization"),
        ("fail5_argparse.log", 2, FailureClass.INVALID_ARGS, "invalid choice: 'bogus'"),
    ],
)
def test_real_cpu_failures(real_log, name, exit_code, expected, needle):
    text = real_log(name)
    failure = classify_failure(text, exit_code=exit_code, health_status=None, phase="startup")
    assert failure.failure_class == expected
    assert needle in failure.message
    assert needle in failure.log_excerpt
    assert failure.exit_code == exit_code
    assert "pid=" not in failure.message  # the vLLM log prefix is stripped


@pytest.mark.parametrize(
    ("name", "phase", "exit_code", "health", "expected"),
    [
        ("cuda_oom_startup.log", "startup", 1, None, FailureClass.CUDA_OOM_STARTUP),
        ("cuda_oom_load.log", "serving", None, 503, FailureClass.CUDA_OOM_LOAD),
        ("engine_dead.log", "serving", 0, None, FailureClass.ENGINE_DEAD),
        ("port_in_use.log", "startup", 1, None, FailureClass.PORT_IN_USE),
        ("startup_hang.log", "startup", None, None, FailureClass.STARTUP_TIMEOUT),
        ("mamba_blocks.log", "startup", 1, None, FailureClass.KV_DOES_NOT_FIT),
    ],
)
def test_gpu_failures(fixture_log, name, phase, exit_code, health, expected):
    text = fixture_log(name)
    failure = classify_failure(text, exit_code=exit_code, health_status=health, phase=phase)
    assert failure.failure_class == expected
    assert failure.log_excerpt


def test_engine_dead_message_is_the_fatal_line(fixture_log):
    failure = classify_failure(
        fixture_log("engine_dead.log"), exit_code=0, health_status=None, phase="serving"
    )
    assert failure.message == "EngineCore encountered a fatal error."


def test_clean_shutdown_echo_is_not_engine_death(real_log):
    # After a requested SIGTERM, 0.32 logs EngineDeadError; that is no failure of the engine.
    text = real_log("run3_fp8.log")
    assert "EngineDeadError" in text
    assert fatal_line(text, phase="serving") is None


def test_health_503_alone_means_engine_dead():
    failure = classify_failure("INFO: ok\n", exit_code=None, health_status=503, phase="serving")
    assert failure.failure_class == FailureClass.ENGINE_DEAD


def test_exit_while_serving_without_a_reason_is_engine_dead():
    failure = classify_failure("INFO: ok\n", exit_code=0, health_status=None, phase="serving")
    assert failure.failure_class == FailureClass.ENGINE_DEAD
    assert "exited with code 0" in failure.message


def test_unknown_keeps_the_tail():
    text = "\n".join(f"line {i}" for i in range(100))
    failure = classify_failure(text, exit_code=1, health_status=None, phase="startup")
    assert failure.failure_class == FailureClass.UNKNOWN
    assert failure.log_excerpt.splitlines()[-1] == "line 99"
    assert "line 0\n" not in failure.log_excerpt


def test_fatal_line_seen_before_exit(real_log):
    # The KV error is logged ~2 s before the process exits: the watcher stops on it.
    text = real_log("fail1_kv1000.log")
    cut = text[: text.index("died unexpectedly")]
    assert "No available memory" in fatal_line(cut, phase="startup")
    assert fatal_line(real_log("run5_eager.log"), phase="startup") is None


def test_engine_core_failure_without_known_cause_is_unknown_not_a_hang():
    text = (
        "(EngineCore pid=5) ERROR 11-30 01:00:00 [core.py:1] EngineCore failed to start.\n"
        "(EngineCore pid=5) ERROR 11-30 01:00:00 [core.py:1] KeyError: 'lm_head.weight'\n"
    )
    assert fatal_line(text, phase="startup") == "EngineCore failed to start."
    failure = classify_failure(text, exit_code=None, health_status=None, phase="startup")
    assert failure.failure_class == FailureClass.UNKNOWN
    assert "KeyError" in failure.log_excerpt
