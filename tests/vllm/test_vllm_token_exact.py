"""Token-exact replay on real vLLM: the tiny model's tokenizer renders every prompt, and the
server's own prompt-token counts prove it (marker ``vllm``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.replay.token_check import TOLERANCE
from tests.e2e.conftest import tuner_args
from tests.e2e.test_real_traces_replay import need, shared_data
from tests.vllm.conftest import TINY_MODEL, VLLM_EXECUTABLE

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

SPACE = Path(__file__).with_name("tiny-space.yaml")
LONG_SPACE = Path(__file__).with_name("tiny-long-space.yaml")  # 16K context


def _autotune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(cwd / "vllm-cache"),
        "COLUMNS": "200",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    }
    argv = [sys.executable, "-m", "autotune", *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=560)


def _try_on_vllm(workload: Path, cwd: Path, space: Path, *load: str) -> dict:
    done = _autotune(
        "try", "--engine", "vllm", "--model", str(TINY_MODEL), "--space", str(space),
        "--workload", str(workload), "--json", *load,
        *tuner_args(cwd / "settings", {"engine": {"vllm_executable": str(VLLM_EXECUTABLE)}}),
        cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no tokenizer" not in done.stderr  # the tiny model's own tokenizer was found
    return json.loads(done.stdout)


def _assert_token_exact(summary: dict, requests: int) -> None:
    replay = summary["replay"]
    assert summary["failure"] is None
    assert replay["failed"] == 0, replay["errors_by_class"]  # no 400 "maximum context length"
    assert replay["completed"] == requests
    check = replay["prompt_tokens_check"]
    assert check is not None and check["token_space"] == "tiny-model", check
    assert check["mismatched"] == 0, check["message"]
    assert check["worst_error"] <= TOLERANCE, check
    assert check["template_tokens"] > 0  # the chat template was measured and accounted for


def test_generated_chat_workload_is_token_exact_on_vllm(tmp_path: Path) -> None:
    workload = tmp_path / "chat.jsonl"
    generated = _autotune(
        "workload", "gen", "chat", "--requests", "30", "--prompt-tokens", "200",
        "--output-tokens", "64", str(workload), cwd=tmp_path,
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    summary = _try_on_vllm(workload, tmp_path, SPACE, "--mode", "concurrency", "--concurrency", "8")
    _assert_token_exact(summary, 30)
    # Every request's output length is exactly the plan's.
    assert summary["replay"]["total_output_tokens"] == sum(
        json.loads(line)["output"]["tokens"]
        for line in workload.read_text().splitlines()
        if '"type":"request"' in line.replace(" ", "")
    )


def test_claude_code_trace_slice_is_token_exact_on_vllm(tmp_path: Path) -> None:
    traces = need(shared_data() / "claude-code-traces")
    trace = min(traces.glob("trace_*.json"), key=lambda path: path.stat().st_size)
    imported, small = tmp_path / "cc.jsonl", tmp_path / "cc-small.jsonl"
    for args in (
        ("workload", "import", "--from", "weka", str(trace), str(imported)),
        # One session, output included, under the 16K context with room for the template.
        ("workload", "slice", str(imported), "--sessions", "1", "--max-context", "16000",
         str(small)),
    ):  # fmt: skip
        done = _autotune(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    requests = small.read_text().count('"type":"request"')
    assert requests >= 3, small.read_text()[:2000]
    # One at a time in plan order: each turn finds its predecessor's prefix cached.
    summary = _try_on_vllm(small, tmp_path, LONG_SPACE, "--mode", "concurrency",
                           "--concurrency", "1")  # fmt: skip
    _assert_token_exact(summary, requests)
