"""A real peer client against the simulator: `vllm bench serve --dataset-name random` finds
the simulator counting prompts exactly as the served model's tokenizer does (marker ``vllm``),
and the simulator's BPE estimate stays within its stated error of a real tokenizer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import REPO
from tests.replay.conftest import free_port, wait_ready
from tests.vllm.conftest import TINY_MODEL, VENV

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]


@pytest.fixture
def sim_with_tokenizer(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    argv = [
        sys.executable, "-m", "autotune.sim", "serve", "qwen3.6-27b-awq",
        "--hardware", "rtx4080s-32g", "--kv-cache-memory-bytes", "9G", "--language-model-only",
        "--startup-s", "0", "--time-scale", "50", "--port", str(port),
        "--tokenizer", str(TINY_MODEL),
    ]  # fmt: skip
    with (tmp_path / "sim.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, timeout_s=60)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_vllm_bench_random_finds_no_tokenizer_mismatch(sim_with_tokenizer: str) -> None:
    argv = [
        str(VENV / "bin" / "vllm"), "bench", "serve", "--base-url", sim_with_tokenizer,
        "--model", "qwen3.6-27b-awq", "--tokenizer", str(TINY_MODEL),
        "--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "8",
        "--num-prompts", "40",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "tokenizer mismatch" not in output, output[-3000:]
    assert re.search(r"Failed requests:\s+0\b", output), output[-3000:]
    total = int(re.search(r"Total input tokens:\s+(\d+)", output).group(1))
    metrics = httpx.get(f"{sim_with_tokenizer}/metrics").text
    served = re.search(r"^vllm:prompt_tokens_total\{[^}]*\} (\S+)", metrics, re.M).group(1)
    assert float(served) == total  # the client's counts are the server's
    assert abs(total - 40 * 256) <= 40 * 256 * 0.01  # ~256 tokens a prompt, not ~10 words


def test_the_bpe_estimate_is_within_its_stated_error_of_a_real_tokenizer() -> None:
    script = REPO / "scripts" / "measure_token_counts.py"
    done = subprocess.run(
        [str(VENV / "bin" / "python"), str(script)], capture_output=True, text=True, timeout=200,
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    rows = [line.split("|") for line in lines[1:] if "---" not in line]
    errors = {row[1].strip(): float(row[5].strip().rstrip("%")) for row in rows}
    assert errors.pop("synthetic words") < -40  # one token each by design (Tekken: 2)
    assert errors and all(abs(error) <= 8.0 for error in errors.values()), errors
