"""A study whose load, not its configs, sets the throughput says so: the configs tie.

Two generated Claude Code sessions whose think times are stretched far past the time
the server needs (the real-traces case of the issue: 2 sessions, every trial 42.5
tok/s): every config serves what the schedule offers, and the run's summary and
`explain` say the configs tie instead of crowning one and ranking flags over a constant.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, autotune_argv, autotune_in_process, tuner_args

SPACE = REPO / "tests" / "results" / "data" / "what-if.yaml"  # KV pool, KV dtype, batch width


@pytest.mark.timeout(240)
def test_a_load_bound_study_says_its_configs_tie_and_how_to_give_them_load(
    tmp_path: Path,
) -> None:
    """Before: a winner crowned among configs within 0.3% of each other, and `explain`
    ranked the flags by importance over that constant."""
    workload = tmp_path / "two-sessions.jsonl"
    made = autotune_in_process(
        "workload", "gen", "claudecode", "--sessions", "2", "--seed", "1",
        "--requests-per-session", "10", "--max-context", "40000", "--prefix-tokens", "14000",
        str(workload),
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    args = [
        "run", "--workload", str(workload), "--engine", "sim", "--hardware", "rtx4080s-32g",
        "--model", "qwen3.6-27b-awq", "--space", str(SPACE), "--storage", storage,
        "--study", "s", "--trials", "4", "--sampler", "random",
        *tuner_args(tmp_path / "settings", {"seed": 1, "simulator": {"time_scale": 400},
                                            "load": {"timing_scale": 0.01, "max_gap_s": 300.0}}),
    ]  # fmt: skip
    done = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=220
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = " ".join(done.stdout[done.stdout.index("Best: trial") :].split())
    assert "warning: The configs tie: all 3 configs measured served" in summary, summary
    assert "the workload offers" in summary and "with an instant server" in summary
    assert "The load, not the config, sets the throughput here" in summary
    assert "the workload has 2 sessions, no more than --concurrency 8" in summary

    explained = autotune_in_process("explain", "--storage", storage, "--study", "s", columns=400)
    assert explained.returncode == 0, explained.stderr
    text = explained.stdout
    assert "The configs tie" in text and "sets the throughput here" in text
    assert "Importance over" not in text  # no ranking of flags over a constant
    assert "would rank noise" in text
