from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.errors import InputError, WorkloadError
from autotune.workload import load_plan, write_workload
from autotune.workload.importers import (
    import_mooncake,
    import_requests_log,
    import_sharegpt,
    import_weka,
    import_workload,
)
from autotune.workload.importers.weka import trace_files
from autotune.workload.slice import slice_workload
from autotune.workload.stats import workload_stats
from tests.conftest import scaled_timeout_s
from tests.workload.conftest import require_data


def test_weka_traces_import_with_sessions_subagents_and_prefix(tmp_path: Path) -> None:
    source = require_data("claude-code-traces")
    workload, report = import_weka(source)
    assert report.read["traces"] >= 20 and not report.dropped
    assert report.read["subagents"] >= 1
    threads = {(r.session, r.thread) for r in workload.requests}
    assert any(thread.startswith("sa:") for _, thread in threads)
    joins = [r for r in workload.requests if r.after and len(r.after) > 1]
    assert joins, "a subagent should be joined by its parent thread"
    # keep the replayed part small: contexts up to 60K
    small, _ = slice_workload(workload, max_context=60_000)
    assert 20 <= len(small.requests) < len(workload.requests)
    out = tmp_path / "weka.jsonl"
    write_workload(out, small.records())
    plan = load_plan(out)
    by_id = {record.id: record for record in small.requests}
    for request in plan.requests:
        assert request.prompt_tokens == by_id[request.id].input_tokens  # token-exact
    assert workload_stats(plan).prefix_hit_ratio > 0.8


def test_weka_single_file_and_subagent_timing() -> None:
    source = require_data("claude-code-traces/trace_0282.json")
    workload, report = import_weka(source)
    assert (report.read["sessions"], report.read["subagents"]) == (1, 3)
    first_sub = next(r for r in workload.requests if r.thread.startswith("sa:"))
    assert first_sub.after and first_sub.after[0].startswith(first_sub.session or "")
    assert first_sub.t_s == pytest.approx(272.112)


def _raw_ideal_hit(trace: dict[str, Any]) -> float:
    """An infinite cache over the trace's own 64-token block ids, requests in time order."""
    calls = []
    for raw in trace["requests"]:
        if raw.get("type") == "subagent":
            calls += [(raw["t"] + sub["t"], sub) for sub in raw.get("requests") or []]
        else:
            calls.append((raw["t"], raw))
    calls.sort(key=lambda call: call[0])
    seen: set[int] = set()
    hit = total = 0
    for _, call in calls:
        leading = 0
        while leading < len(call["hash_ids"]) and call["hash_ids"][leading] in seen:
            leading += 1
        hit += min(64 * leading, call["in"])
        total += call["in"]
        seen.update(call["hash_ids"])
    return hit / total


def test_weka_import_keeps_every_leading_block_the_raw_ids_share(tmp_path: Path) -> None:
    """Requests that leave the thread's first prefix part-way still share its start."""
    for path in trace_files(require_data("claude-code-traces")):
        workload, _ = import_weka(path)
        out = tmp_path / f"{path.stem}.jsonl"
        write_workload(out, workload.records())
        stats = workload_stats(load_plan(out), block_size=64)
        raw = _raw_ideal_hit(json.loads(path.read_text()))
        assert stats.prefix_hit_ratio == pytest.approx(raw, abs=1e-9), path.name


def test_weka_import_cli_ideal_hit_equals_the_raw_ids(tmp_path: Path) -> None:
    source = require_data("claude-code-traces/trace_0247.json")
    out = tmp_path / "t.jsonl"
    autotune = [sys.executable, "-m", "autotune", "workload"]
    run = [*autotune, "import", "--from", "weka", str(source), str(out)]
    assert subprocess.run(run, capture_output=True, timeout=scaled_timeout_s(60)).returncode == 0
    stats = [*autotune, "stats", "--json", "--block-size", "64", str(out)]
    result = subprocess.run(stats, capture_output=True, text=True, timeout=scaled_timeout_s(60))
    hit = json.loads(result.stdout)["prefix_hit_ratio"]
    assert hit == pytest.approx(_raw_ideal_hit(json.loads(source.read_text())), abs=1e-9)


def test_mooncake_imports_global_512_token_blocks(tmp_path: Path) -> None:
    source = require_data("mooncake/conversation_trace.jsonl")
    workload, report = import_mooncake(source)
    assert report.read["requests"] == 12031 and not report.dropped
    assert workload.header.block_size == 512 and workload.header.hash_scope == "global"
    small, _ = slice_workload(workload, duration_s=30)
    out = tmp_path / "mooncake.jsonl"
    write_workload(out, small.records())
    plan = load_plan(out)
    assert all(r.session is None for r in plan.requests)
    assert plan.requests[-1].arrival_s <= 30
    # every request starts with hash id 0: the first 512 tokens are shared
    first, second = plan.requests[0], plan.requests[1]
    assert first.messages[0].text.split()[:512] == second.messages[0].text.split()[:512]


def test_mooncake_reports_bad_lines(tmp_path: Path) -> None:
    source = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 3000, "input_length": 100, "output_length": 0, "hash_ids": [0]},
        {"timestamp": 3000, "input_length": 100, "hash_ids": [0]},
        {"timestamp": 3000, "input_length": 100, "output_length": 5, "hash_ids": [0, 1, 2]},
    ]
    source.write_text("\n".join(json.dumps(row) for row in rows) + "\nnot json\n")
    workload, report = import_mooncake(source)
    assert [r.t_s for r in workload.requests] == [0.0, 3.0]
    assert sum(report.dropped.values()) == 3
    assert report.adjusted == {"output_length 0 replayed as 1 token": 1}


def test_sharegpt_conversations_become_delta_sessions(tmp_path: Path) -> None:
    source = tmp_path / "sg.json"
    conversations = [
        {
            "id": "x",
            "conversations": [
                {"from": "human", "value": "what is two plus two"},
                {"from": "gpt", "value": "four"},
                {"from": "human", "value": "and times three"},
                {"from": "gpt", "value": "twelve of course"},
            ],
        },
        {"id": "y", "conversations": [{"from": "human", "value": "unanswered"}]},
    ]
    source.write_text(json.dumps(conversations))
    workload, report = import_sharegpt(source)
    assert report.dropped["conversation with no answered human turn"] == 1
    out = tmp_path / "sg.jsonl"
    write_workload(out, workload.records())
    first, second = load_plan(out).requests
    assert first.output_tokens == 1 and second.output_tokens == 3
    assert [m.text for m in second.messages] == ["what is two plus two", "four", "and times three"]
    assert second.after == (first.id,) and second.session == first.session


def test_openai_log_chains_growing_conversations(tmp_path: Path) -> None:
    source = tmp_path / "log.jsonl"
    system = {"role": "system", "content": "be brief"}
    turn1 = [system, {"role": "user", "content": "list files"}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "ls"}}]},
        {"role": "tool", "content": "a.txt b.txt"},
    ]
    other = [system, {"role": "user", "content": "unrelated question"}]
    lines = [
        {"model": "m", "messages": turn1, "max_tokens": 50},
        {"model": "m", "messages": other, "max_tokens": 20},
        {"model": "m", "messages": turn2},
        {"model": "m", "prompt": "complete this"},
        {"no": "body"},
    ]
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    workload, report = import_requests_log(source, kind="openai")
    assert report.read["requests"] == 4
    assert report.dropped == {"no request body with messages / prompt": 1}
    modes = [r.input.mode for r in workload.requests]
    assert modes == ["full", "full", "delta", "full"]
    assert workload.requests[2].parent == workload.requests[0].id
    # lone requests stay independent; the chained pair shares an inferred session
    assert workload.requests[1].session is None and workload.requests[3].session is None
    assert workload.requests[0].session == workload.requests[2].session is not None
    assert workload.requests[3].endpoint == "openai.completions"
    out = tmp_path / "w.jsonl"
    write_workload(out, workload.records())
    plan = {r.id: r for r in load_plan(out).requests}
    chained = plan[workload.requests[2].id]
    assert chained.system == "be brief"
    assert chained.messages[-1].text == "a.txt b.txt"


def test_import_dispatch_rejects_unknown_source(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--from: must be one of"):
        import_workload("csv", tmp_path)
    with pytest.raises(WorkloadError, match="no readable Weka trace"):
        import_weka(tmp_path)


def test_mooncake_stats_match_the_hash_level_prefix_hit_ratio(tmp_path: Path) -> None:
    """With 512-token blocks the token-level ideal cache must equal the trace's own ids."""
    source = require_data("mooncake/conversation_trace.jsonl")
    workload, _ = import_mooncake(source)
    small, _ = slice_workload(workload, duration_s=45)
    seen: set[int] = set()
    hit_tokens = total_tokens = 0
    for request in small.requests:
        spec = request.input
        full_blocks = spec.hash_ids[: spec.tokens // 512]
        leading = 0
        while leading < len(full_blocks) and full_blocks[leading] in seen:
            leading += 1
        hit_tokens += 512 * leading
        total_tokens += spec.tokens
        seen.update(full_blocks)
    out = tmp_path / "m.jsonl"
    write_workload(out, small.records())
    stats = workload_stats(load_plan(out), block_size=512)
    assert stats.input_tokens.total == total_tokens
    assert stats.prefix_hit_ratio == pytest.approx(hit_tokens / total_tokens)
    assert stats.prefix_hit_ratio > 0.01  # every request shares at least block 0
