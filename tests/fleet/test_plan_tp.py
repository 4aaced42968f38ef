"""`autotune plan --tp 1 --tp 2`: both sizes are planned, the TP-2 fleet is priced per GPU
and its deploy argv shards the model (the simulator models TP on one node)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(180)]


def autotune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=150
    )


def test_plan_lists_tp2_candidates_beside_tp1(tmp_path: Path) -> None:
    workload = tmp_path / "agents.jsonl"
    made = autotune(
        "workload", "gen", "claudecode", "--sessions", "4", "--seed", "2",
        "--requests-per-session", "2", "--prefix-tokens", "2000", "--max-context", "6000",
        str(workload),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    done = autotune(
        "plan", str(workload), "--model", "qwen3-32b-awq", "--gpu", "h100-80g",
        "--tp", "1", "--tp", "2", "--sessions", "3", "--slo", "ttft_p95<=5s",
        "--out", str(tmp_path / "out"), "--price", "h100=1.25",
        "--storage", str(tmp_path / "studies" / "autotune.db"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "h100-80g TP 2" in done.stdout
    rows = {
        row["tp"]: row
        for row in json.loads((tmp_path / "out" / "plan.json").read_text())["candidates"]
    }
    assert set(rows) == {1, 2}
    one, two = rows[1], rows[2]
    assert two["replicas"] is not None and two["gpus"] == 2 * two["replicas"]
    # --price h100=1.25 names the h100-80g inexactly, yet over the catalog's exact 2.50
    assert one["usd_per_gpu_hour"] == two["usd_per_gpu_hour"] == 1.25
    assert two["usd_per_hour"] == pytest.approx(two["gpus"] * two["usd_per_gpu_hour"])
    argv = two["argv"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert "--tensor-parallel-size" not in one["argv"]
    if one["replicas"] == two["replicas"]:  # the same share of the load: TP 2 decodes faster
        assert two["tpot_p95_s"] < one["tpot_p95_s"]
