"""The real data sets import, slice and replay against the simulator process, via the CLI."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, autotune_argv, start_sims

pytestmark = [pytest.mark.timeout(240)]


def shared_data() -> Path:
    return Path(os.environ.get("AUTOTUNE_SHARED_DATA", REPO.parent / "shared" / "data"))


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real data set not found at {path} (set AUTOTUNE_SHARED_DATA)")
    return path


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for start in start_sims(tmp_path_factory.mktemp("sim")):
        yield start(50.0)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        autotune_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=200,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def replay_json(sim_url: str, workload: Path, *args: str, cwd: Path) -> dict:
    """The one level's result of `autotune replay --json`."""
    result = cli("replay", "--url", sim_url, "--workload", str(workload),
                 "--server-time-scale", "50", "--json", *args, cwd=cwd)  # fmt: skip
    (level,) = json.loads(result.stdout)
    return level["result"]


def test_a_claude_code_trace_imports_slices_and_replays(sim_url: str, tmp_path: Path) -> None:
    traces = need(shared_data() / "claude-code-traces")
    trace = min(traces.glob("trace_*.json"), key=lambda path: path.stat().st_size)
    # The simulated Qwen3.6 serves 16K-token requests by default: slice under that.
    imported, small = tmp_path / "cc.jsonl", tmp_path / "cc-small.jsonl"
    cli("workload", "import", "--from", "weka", str(trace), str(imported), cwd=tmp_path)
    cli("workload", "slice", str(imported), "--sessions", "1", "--max-context", "12000",
        str(small), cwd=tmp_path)  # fmt: skip
    requests = small.read_text().count('"type":"request"')
    assert requests >= 2
    summary = replay_json(sim_url, small, "--mode", "sessions", "--max-requests", "4",
                          "--max-gap", "1s", cwd=tmp_path)  # fmt: skip
    stats, server = summary["stats"], summary["server_stats"]
    assert (stats["completed"], stats["failed"]) == (min(requests, 4), 0)
    assert server["generation_tokens"] == stats["total_output_tokens"]
    # Turns of one session extend each other: the server's prefix cache hits.
    assert server["prefix_cache_hit_rate"] > 0.3


def test_the_mooncake_trace_imports_slices_and_replays_open_loop(
    sim_url: str, tmp_path: Path
) -> None:
    trace = need(shared_data() / "mooncake" / "conversation_trace.jsonl")
    head = tmp_path / "head.jsonl"
    with trace.open() as source:  # the first few hundred requests are plenty
        head.write_text("".join(line for _, line in zip(range(300), source, strict=False)))
    imported, small = tmp_path / "mc.jsonl", tmp_path / "mc-small.jsonl"
    cli("workload", "import", "--from", "mooncake", str(head), str(imported), cwd=tmp_path)
    cli("workload", "slice", str(imported), "--max-context", "12000", "--duration", "60s",
        str(small), cwd=tmp_path)  # fmt: skip
    summary = replay_json(sim_url, small, "--mode", "trace", "--max-requests", "6",
                          "--time-scale", "10", cwd=tmp_path)  # fmt: skip
    stats, server = summary["stats"], summary["server_stats"]
    assert (stats["completed"], stats["failed"]) == (6, 0)
    assert server["generation_tokens"] == stats["total_output_tokens"]
    assert server["prompt_tokens"] == stats["total_input_tokens"]
    # (Mooncake's shared first block is 512 tokens, shorter than the hybrid model's
    # attention block, so the prefix cache rightly finds no full block to reuse here.)
