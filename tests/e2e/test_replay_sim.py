"""The replayer against the simulator process: the three load modes, token counts that
match the server's own /metrics, time-scale consistency, and the `autotune replay` command."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.replay.load import LoadSpec
from autotune.replay.runner import ReplayResult, replay
from autotune.workload.expand import expand
from autotune.workload.gen import ClaudeCodeParams, claudecode, fixed
from autotune.workload.io import write_workload
from autotune.workload.plan import WorkloadPlan
from tests.e2e.conftest import SimFactory, start_sims
from tests.replay.conftest import free_port, wait_ready

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def fast_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One simulator at 50x for the module."""
    for start in start_sims(tmp_path_factory.mktemp("sim")):
        yield start(50.0)


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[SimFactory]:
    yield from start_sims(tmp_path)


def _agent_plan() -> WorkloadPlan:
    params = ClaudeCodeParams(
        sessions=4, seed=3, user_turns=1, tool_steps_mean=2.0, requests_per_session=4,
        prefix_tokens=1500, subagent_prefix_tokens=800, max_context=8000, subagent_rate=0.5,
        session_stagger_s=5.0,
    )  # fmt: skip
    return expand(claudecode(params), name="agents")


def _fixed_plan(requests: int, output_tokens: int) -> WorkloadPlan:
    workload = fixed(requests=requests, prompt_tokens=256, output_tokens=output_tokens)
    return expand(workload, name="fixed")


def _replay(url: str, plan: WorkloadPlan, load: LoadSpec, scale: float) -> ReplayResult:
    return asyncio.run(
        replay(url=url, plan=plan, load=load, model_name="", server_time_scale=scale,
               scrape_interval_s=0.2)
    )  # fmt: skip


@pytest.mark.parametrize(
    "load",
    [
        LoadSpec(mode="concurrency", concurrency=4, max_gap_s=2.0),
        LoadSpec(mode="sessions", concurrency=4, max_gap_s=2.0),
        LoadSpec(mode="trace", timing_scale=4.0, max_gap_s=2.0),
    ],
    ids=lambda load: load.mode,
)
def test_load_modes_count_the_tokens_the_server_generated(fast_sim: str, load: LoadSpec) -> None:
    plan = _agent_plan()
    result = _replay(fast_sim, plan, load, 50.0)
    stats, server = result.stats, result.server_stats
    assert stats.failed == 0 and stats.completed == len(plan.requests)
    assert [r.output_tokens for r in result.records] == [
        {p.id: p.output_tokens for p in plan.requests}[r.id] for r in result.records
    ]  # exact output lengths
    assert server is not None and server.generation_tokens == stats.total_output_tokens
    assert server.prompt_tokens is not None and server.prompt_tokens > 0
    if load.mode == "sessions":  # turns share their session's prefix
        assert server.prefix_cache_hit_rate is not None and server.prefix_cache_hit_rate > 0.3


def test_scale_1_and_scale_5_give_the_same_figures(sims: SimFactory) -> None:
    # Wall-clock scaling: at 5x a simulated token still takes ~7 ms of real time, so the
    # host's scheduling jitter on a loaded 2-core machine stays a few percent of it (at 20x
    # it reached 19% of TPOT in CI). Host-independent figures are the lockstep mode's job.
    plan = _fixed_plan(8, 32)
    load = LoadSpec(mode="concurrency", concurrency=4)
    slow = _replay(sims(1.0), plan, load, 1.0).stats
    fast = _replay(sims(5.0), plan, load, 5.0).stats
    assert fast.completed == slow.completed == 8
    assert fast.tpot.mean == pytest.approx(slow.tpot.mean, rel=0.15)
    assert fast.output_throughput_tok_s == pytest.approx(slow.output_throughput_tok_s, rel=0.3)
    assert fast.ttft.mean == pytest.approx(slow.ttft.mean, rel=0.5)


def test_replay_command_sweep_as_json(fast_sim: str, tmp_path: Path) -> None:
    path = tmp_path / "fixed.jsonl"
    write_workload(path, fixed(requests=8, prompt_tokens=128, output_tokens=16).records())
    argv = [
        sys.executable, "-m", "autotune", "replay", "--url", fast_sim, "-w", str(path),
        "--mode", "concurrency", "--sweep", "1,4", "--server-time-scale", "50", "--json",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    levels = json.loads(done.stdout)
    assert [level["load"]["concurrency"] for level in levels] == [1, 4]
    assert all(level["result"]["stats"]["completed"] == 8 for level in levels)
    assert levels[1]["result"]["stats"]["max_concurrent_requests"] == 4
    assert levels[0]["result"]["server_stats"]["generation_tokens"] == 8 * 16


def test_replay_command_rejects_a_bad_sweep(tmp_path: Path) -> None:
    path = tmp_path / "fixed.jsonl"
    write_workload(path, fixed(requests=1, prompt_tokens=8, output_tokens=1).records())
    argv = [sys.executable, "-m", "autotune", "replay", "--url", "http://127.0.0.1:9",
            "-w", str(path), "--sweep", "4,x"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--sweep" in done.stderr


def test_replay_separates_first_prefill_hits_from_re_prefill_after_preemption(
    tmp_path: Path,
) -> None:
    """A 1 GiB pool under 32 clients preempts; the server's hit counter then also counts
    the preempted requests' re-prefill, which the per-request usage figure does not."""
    autotune = [sys.executable, "-m", "autotune"]
    path = tmp_path / "chat.jsonl"
    gen = [*autotune, "workload", "gen", "chat", "--requests", "120", "--prompt-tokens",
           "600", "--output-tokens", "600", "--system-tokens", "1500", str(path)]  # fmt: skip
    subprocess.run(gen, capture_output=True, timeout=60, check=True)
    port = free_port()
    argv = [sys.executable, "-m", "autotune.sim", "serve", "llama-3.1-8b", "--hardware",
            "h100-80g", "--kv-cache-memory-bytes", "1G", "--max-model-len", "4096",
            "--enable-prefix-caching", "--port", str(port), "--time-scale", "100",
            "--startup-s", "0"]  # fmt: skip
    with (tmp_path / "sim.log").open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process, timeout_s=60)
        replay_argv = [*autotune, "replay", "--url", url, "-w", str(path), "--mode", "concurrency",
                       "--concurrency", "32", "--server-time-scale", "100", "--json"]  # fmt: skip
        done = subprocess.run(replay_argv, capture_output=True, text=True, timeout=90)
        wide = {**os.environ, "COLUMNS": "300"}
        text = subprocess.run(
            replay_argv[:-1], capture_output=True, text=True, timeout=90, env=wide
        )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    assert done.returncode == 0, done.stderr
    (level,) = json.loads(done.stdout)
    stats, server = level["result"]["stats"], level["result"]["server_stats"]
    stats_argv = [*autotune, "workload", "stats", "--json", str(path)]
    ideal = json.loads(subprocess.run(stats_argv, capture_output=True, timeout=60).stdout)
    first_prefill = stats["cached_input_tokens"] / stats["total_input_tokens"]
    assert server["preemptions"] > 0
    assert first_prefill <= ideal["prefix_hit_ratio"] + 1e-9
    assert server["prefix_cache_hit_rate"] > first_prefill
    assert "re-prefill of" in level["prefix_cache_note"]
    assert "cached at first prefill" in text.stdout and "re-prefill of" in text.stdout
