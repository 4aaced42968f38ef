"""`autotune bench serve`, the real command, on simulator processes: vLLM's block, the
simulator started for it (lockstep: its figures are the in-process prediction's), a
running server driven at a Poisson rate under a concurrency cap, and bad flags."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.replay.bench_datasets import BenchDataset, bench_plan
from autotune.replay.bench_serve import bench_load
from autotune.sim.model.config import SimConfig
from autotune.sim.virtual.predict import predict
from tests.e2e.conftest import REPO
from tests.replay.conftest import free_port, wait_ready

AUTOTUNE = [sys.executable, "-m", "autotune", "bench", "serve"]
SIM = ["--engine", "sim", "--hardware", "h100-80g", "--model", "llama-3.1-8b"]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)


def _figure(output: str, label: str) -> float:
    return float(re.search(rf"^{re.escape(label)}\s+(\S+)", output, re.M).group(1))


def test_on_the_simulator_it_prints_vllms_block_with_the_predicted_figures() -> None:
    flags = ["--num-prompts", "24", "--max-concurrency", "4", "--random-input-len", "512",
             "--random-output-len", "64", "--ignore-eos", "--seed", "1"]  # fmt: skip
    done = _run([*AUTOTUNE, *SIM, *flags, "--", "--max-num-seqs", "8"])
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "============ Serving Benchmark Result ============" in out
    assert _figure(out, "Successful requests:") == 24
    assert _figure(out, "Maximum request concurrency:") == 4
    assert _figure(out, "Total input tokens:") == 24 * 512  # the server's own count
    assert _figure(out, "Total generated tokens:") == 24 * 64
    dataset = BenchDataset(
        num_prompts=24, random_input_len=512, random_output_len=64, ignore_eos=True, seed=1
    )
    predicted = predict(
        SimConfig(hardware="h100-80g", model="llama-3.1-8b", max_num_seqs=8),
        bench_plan(dataset),
        bench_load(num_prompts=24, max_concurrency=4, request_rate=math.inf),
    ).stats
    assert _figure(out, "Output token throughput (tok/s):") == pytest.approx(
        predicted.output_throughput_tok_s, rel=0.005
    )
    assert _figure(out, "Median TPOT (ms):") == pytest.approx(predicted.tpot.p50 * 1e3, rel=0.005)
    assert _figure(out, "Median TTFT (ms):") == pytest.approx(predicted.ttft.p50 * 1e3, rel=0.005)


@pytest.fixture
def sim_url(tmp_path: Path) -> Iterator[str]:
    """A simulator on real time (scale 1), as a user's server would be."""
    port = free_port()
    argv = [sys.executable, "-m", "autotune.sim", "serve", "llama-3.1-8b", "--hardware",
            "h100-80g", "--startup-s", "0", "--time-scale", "1", "--port", str(port)]  # fmt: skip
    with (tmp_path / "sim.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, timeout_s=60)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_a_running_server_at_a_poisson_rate_under_a_concurrency_cap(sim_url: str) -> None:
    flags = ["--base-url", sim_url, "--num-prompts", "30", "--request-rate", "40",
             "--max-concurrency", "3", "--random-input-len", "256", "--random-output-len", "32",
             "--ignore-eos", "--json"]  # fmt: skip
    done = _run([*AUTOTUNE, *flags])
    assert done.returncode == 0, done.stderr[-2000:]
    stats = json.loads(done.stdout)
    assert stats["completed"] == 30 and stats["failed"] == 0
    assert stats["total_output_tokens"] == 30 * 32
    assert stats["max_concurrent_requests"] == 3  # the cap held, and was reached
    assert stats["duration_s"] >= 0.7  # the arrivals alone span 30 / 40 s


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dataset-name", "sonnet"], "--dataset-name 'sonnet': random or sharegpt"),
        (["--request-rate", "0"], "--request-rate '0': must be > 0"),
        (["--random-range-ratio", "1.5"], "--random-range-ratio must be in [0, 1)"),
        (["--engine", "sim", "--model", "llama-3.1-8b"], "--engine sim needs --hardware"),
        ([*SIM[:4], "--model", "gpt-9"], "gpt-9"),
        (["--dataset-name", "sharegpt"], "--dataset-name sharegpt needs --dataset-path"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(flags: list[str], message: str) -> None:
    done = _run([*AUTOTUNE, "--base-url", "http://127.0.0.1:9", *flags])
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
