"""`autotune try`: one config through the same trial path as a study, no storage."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    REPO,
    SAMPLE_WORKLOAD,
    autotune_argv,
    autotune_in_process,
    processes_in,
    tuner_args,
)

QWEN_SPACE = REPO / "search_spaces" / "qwen3.6-27b-awq.yaml"
FAST = {"simulator": {"time_scale": 50}, "load": {"max_requests": 4}}


def base(tmp_path: Path) -> list[str]:
    return ["try", "--workload", str(SAMPLE_WORKLOAD), "--model", "qwen3.6-27b-awq",
            "--hardware", "rtx4080s-32g", *tuner_args(tmp_path / "settings", FAST)]  # fmt: skip


def try_json(tmp_path: Path, *sets: str) -> dict:
    result = subprocess.run(
        autotune_argv(*base(tmp_path), *sets, "--json"), cwd=tmp_path, capture_output=True,
        text=True, timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.mark.timeout(120)
def test_try_runs_the_baseline_with_changes_and_reports_like_a_trial(tmp_path: Path) -> None:
    ok = try_json(tmp_path, "--set", "mtp_k=1", "--set", "kv_cache_dtype=FP8_E4M3")
    assert ok["outcome"] == "ok"
    assert ok["params"]["mtp_k"] == 1 and ok["params"]["kv_cache_dtype"] == "fp8_e4m3"
    assert '{"method":"mtp","num_speculative_tokens":1}' in ok["argv"]
    assert ok["replay"]["completed"] == 4
    assert ok["values"][0] == pytest.approx(ok["replay"]["output_throughput_tok_s"])
    assert ok["constraints"]["oom"] < 0
    assert (tmp_path / ok["log"]).exists()

    oom = try_json(tmp_path, "--set", "kv_cache_memory_gib=13")
    assert oom["outcome"] in ("cuda-oom-startup", "kv-does-not-fit")
    assert oom["values"] is None and oom["constraints"]["oom"] > 0
    assert processes_in(tmp_path) == []


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("mtp=2", "expected NAME=VALUE"),
        ("mtp_k=9", "outside the space's range"),
        ("kv_cache_dtype=int3", "expected one of auto, fp8_e4m3, fp8_e5m2"),
    ],
)
def test_try_rejects_bad_assignments(tmp_path: Path, assignment: str, message: str) -> None:
    result = autotune_in_process(*base(tmp_path), "--set", assignment)  # refused before launch
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.timeout(120)
def test_try_simulates_a_catalog_model_under_the_users_name_and_max_model_len(
    tmp_path: Path,
) -> None:
    """max-model-len from the space's fixed:, the load and speed from its tuner: section."""
    space = tmp_path / "qwen.yaml"
    space.write_text(
        QWEN_SPACE.read_text().replace("fixed:\n", "fixed:\n  max-model-len: 40000\n")
        + "tuner:\n  simulator:\n    time_scale: 50\n  load:\n    max_requests: 2\n"
    )
    result = subprocess.run(
        autotune_argv("try", "--workload", str(SAMPLE_WORKLOAD), "--model", "/models/Qwen3.6-27B",
                      "--sim-model", "qwen3.6-27b-awq", "--hardware", "rtx4080s-32g",
                      "--space", str(space), "--json"),
        cwd=tmp_path, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ok = json.loads(result.stdout)
    assert ok["outcome"] == "ok"
    argv = ok["argv"]
    assert argv[argv.index("serve") + 1] == "qwen3.6-27b-awq"  # the simulated catalog model
    assert argv[argv.index("--served-model-name") + 1] == "/models/Qwen3.6-27B"
    assert argv[argv.index("--max-model-len") + 1] == "40000"
    assert argv[argv.index("--time-scale") + 1] == "50"
    assert ok["replay"]["completed"] == 2
