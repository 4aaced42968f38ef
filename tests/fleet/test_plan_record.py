"""plan.json says, per GPU kind and TP, how many configs were weighed for it and why it
lost: no fleet meets the limits (and by how much the most replicas miss), or it costs
more than the winner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import scaled_timeout_s

pytestmark = [pytest.mark.timeout(300)]


def autotune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True, text=True, timeout=scaled_timeout_s(150),
    )  # fmt: skip


def test_every_loser_says_why_and_every_kind_how_many_configs(tmp_path: Path) -> None:
    workload = tmp_path / "agents.jsonl"
    made = autotune(
        "workload", "gen", "claudecode", "--sessions", "4", "--seed", "2",
        "--requests-per-session", "2", "--prefix-tokens", "2000", "--max-context", "6000",
        str(workload),
    )  # fmt: skip
    assert made.returncode == 0 and "3 sessions" in made.stdout, made.stdout + made.stderr
    done = autotune(
        "plan", str(workload), "--model", "qwen3-32b-awq", "--gpu", "rtx4090-24g",
        "--gpu", "h100-80g", "--tp", "1", "--tp", "2", "--sessions", "3",
        "--slo", "ttft_p95<=1s", "--out", str(tmp_path / "out"),
        "--storage", str(tmp_path / "studies" / "autotune.db"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "out" / "plan.json").read_text())["candidates"]
    winner, losers = rows[0], rows[1:]
    assert len(rows) == 4 and winner["lost_because"] is None
    won = f"{winner['replicas']} x {winner['gpu']}"
    for row in losers:
        if row["replicas"] is None:  # e.g. the 4090: even one session a replica is too slow
            assert row["lost_because"].startswith("no fleet meets the limits; 3 replicas")
            assert "misses slo:ttft_p95 by +" in row["lost_because"]
        else:
            assert row["usd_per_hour"] > winner["usd_per_hour"]
            assert row["lost_because"].startswith(f"costs more: {row['replicas']} x {row['gpu']}")
            assert f"against {won}" in row["lost_because"]
    assert any(row["replicas"] is None for row in losers)
    assert any(row["replicas"] is not None for row in losers)
    considered = {(row["gpu"], row["tp"]): row["configs_considered"] for row in rows}
    assert all(count > 0 for count in considered.values()), considered
    # More memory lets more of the lattice start: the H100 weighs at least the 4090's.
    assert considered[("h100-80g", 1)] >= considered[("rtx4090-24g", 1)]
    assert considered[("rtx4090-24g", 2)] >= considered[("rtx4090-24g", 1)]
