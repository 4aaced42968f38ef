from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.workload import expand, load_plan
from autotune.workload.gen import ChatParams, ClaudeCodeParams, chat, claudecode, fixed
from autotune.workload.stats import workload_stats

REPO = Path(__file__).resolve().parents[2]


def test_claudecode_follows_published_shape() -> None:
    workload = claudecode(ClaudeCodeParams(sessions=12, seed=3, max_context=None))
    plan = expand(workload)
    outputs = [r.output_tokens for r in plan.requests]
    assert 150 <= statistics.median(outputs) <= 320  # published median ~220
    assert len(plan.sessions) == 12
    assert any(r.thread.startswith("sa:") for r in plan.requests)
    mains = [r for r in plan.requests if r.thread == "main"]
    first_turns = [r for r in mains if not r.after]
    assert all(r.prompt_tokens > 18_000 for r in first_turns)  # the shared prefix
    assert workload_stats(plan).prefix_hit_ratio > 0.85
    by_id = {r.id: r for r in mains}
    growth = [
        b.prompt_tokens - by_id[b.after[0]].prompt_tokens - by_id[b.after[0]].output_tokens
        for b in mains
        if b.after and b.after[0] in by_id
    ]
    assert 300 <= statistics.median(growth) <= 1_200  # published ~650-860 new tokens per step


def test_claudecode_respects_size_limits_and_seed() -> None:
    params = ClaudeCodeParams(sessions=4, seed=9, requests_per_session=5, max_context=30_000)
    plan = expand(claudecode(params))
    per_session = {s: sum(1 for r in plan.requests if r.session == s) for s in plan.sessions}
    assert max(per_session.values()) <= 5
    assert max(r.prompt_tokens for r in plan.requests) <= 30_000
    again = expand(claudecode(params))
    assert again.requests == plan.requests


def test_fixed_requests_are_exact() -> None:
    plan = expand(fixed(requests=3, prompt_tokens=64, output_tokens=16))
    assert [(r.prompt_tokens, r.output_tokens, r.arrival_s) for r in plan.requests] == [
        (64, 16, 0.0)
    ] * 3
    assert len({r.messages for r in plan.requests}) == 3  # no accidental sharing


def test_sample_workload_is_reproducible_from_documented_command(tmp_path: Path) -> None:
    out = tmp_path / "sample.jsonl"
    documented = (
        "gen claudecode --sessions 7 --requests-per-session 8 --prefix-tokens 14000 "
        "--max-context 40000 --seed 1"
    )
    result = CliRunner().invoke(app, ["workload", *documented.split(), str(out)])
    assert result.exit_code == 0, result.output
    sample = REPO / "workloads" / "sample-claudecode.jsonl"
    assert out.read_bytes() == sample.read_bytes()
    assert 4 <= len(load_plan(sample).requests) / len(load_plan(sample).sessions) <= 8
    assert (
        "gen claudecode --sessions 7 --requests-per-session 8 --prefix-tokens 14000"
        in (REPO / "docs" / "workload-format.md").read_text()
    )


def test_chat_requests_are_independent_with_poisson_arrivals() -> None:
    plan = expand(chat(ChatParams(requests=400, seed=2, rate_rps=4.0, system_tokens=100)))
    arrivals = [r.arrival_s for r in plan.requests]
    assert arrivals == sorted(arrivals) and all(r.session is None for r in plan.requests)
    assert 400 / arrivals[-1] == pytest.approx(4.0, rel=0.2)
    assert len({r.system for r in plan.requests}) == 1  # the shared system prompt
    assert 500 <= statistics.median(r.prompt_tokens - 100 for r in plan.requests) <= 1_100
