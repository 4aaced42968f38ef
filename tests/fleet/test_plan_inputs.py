"""`autotune plan` refuses, in one line and exit 2, every input that would make a plan
mislead: a price that is no price or names no GPU planned, a TP vLLM refuses for the
model, more sessions at once than the workload has. Nothing is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import scaled_timeout_s

WORKLOAD = Path(__file__).parents[2] / "workloads" / "sample-claudecode.jsonl"  # 7 sessions


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--price", "h100-80g=inf"], "'h100-80g=inf': expected GPU=USD_PER_HOUR, the price a "
         "finite number > 0"),
        (["--price", "h100-80g=nan"], "'h100-80g=nan': expected GPU=USD_PER_HOUR, the price a "
         "finite number > 0"),
        (["--price", "nosuch=1"], "--price nosuch=1: nosuch names no catalog GPU"),
        (["--price", "a100-80g=1"], "--price a100-80g=1: no GPU kind planned is a100-80g "
         "(planned: h100-80g); add --gpu a100-80g"),
        (["--tp", "3"], "--tp 3: vLLM refuses it at start: qwen3.6-27b-awq has 4 KV heads: TP "
         "must divide them or be a multiple of them"),
        (["--tp", "5"], "--tp 5: vLLM refuses it at start: qwen3.6-27b-awq has 24 attention "
         "heads, not divisible by 5"),
        (["--sessions", "100000"], "--sessions 100000: sample-claudecode has 7 sessions, so at "
         "most 7 run at once; give --sessions 7 or fewer, or a workload with more sessions "
         "(e.g. `autotune workload gen claudecode --sessions N ...`)"),
    ],
)  # fmt: skip
def test_a_misleading_input_is_one_line_and_exit_2(
    args: list[str], says: str, tmp_path: Path
) -> None:
    sessions = [] if "--sessions" in args else ["--sessions", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "plan", str(WORKLOAD), "--model", "qwen3.6-27b-awq",
         "--gpu", "h100-80g", "--slo", "ttft_p95<=3s", "--out", str(tmp_path / "plan"),
         "--storage", str(tmp_path / "autotune.db"), *sessions, *args],
        capture_output=True, text=True, timeout=scaled_timeout_s(120),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "plan").exists()
