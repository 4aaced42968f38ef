from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from autotune.workload import expand, load_plan, read_workload
from autotune.workload.slice import measure, slice_workload
from autotune.workload.tokenizer import WordTokenizer
from tests.conftest import scaled_timeout_s
from tests.workload.conftest import HEADER


def _session(name: str, start_s: float, turns: int, append_tokens: int) -> list[dict[str, object]]:
    records: list[dict[str, object]] = []
    for turn in range(turns):
        rid = f"{name}.{turn}"
        record: dict[str, object] = {
            "type": "request",
            "id": rid,
            "session": name,
            "t_s": start_s + 10 * turn,
            "output": {"tokens": 10},
        }
        content = [{"role": "user", "content": [{"tokens": append_tokens}]}]
        if turn:
            record["parent"] = f"{name}.{turn - 1}"
            record["input"] = {"mode": "delta", "append": content}
        else:
            record["input"] = {"mode": "full", "messages": content}
        records.append(record)
    return records


def test_slice_cuts_sessions_context_and_time(write_jsonl: Callable[..., Path]) -> None:
    path = write_jsonl(
        [HEADER, *_session("s1", 0, 4, 100), *_session("s2", 5, 4, 100), *_session("s3", 9, 2, 5)]
    )
    workload = read_workload(path)
    # prompts: 100, 210, 320, 430 per session; prompt + output: 110, 220, 330, 440
    sliced, report = slice_workload(workload, sessions=2, max_context=330)
    assert [r.id for r in sliced.requests] == ["s1.0", "s1.1", "s1.2", "s2.0", "s2.1", "s2.2"]
    assert report.dropped == {"session beyond --sessions": 2, "prompt + output over 330 tokens": 2}
    assert report.sessions_dropped == 1

    sliced, report = slice_workload(workload, duration_s=15)
    assert [r.id for r in sliced.requests] == ["s1.0", "s1.1", "s2.0", "s2.1", "s3.0"]
    assert load_plan(path).requests  # the source still loads


def test_slice_drops_descendants_and_dangling_joins(write_jsonl: Callable[..., Path]) -> None:
    user = [{"role": "user", "content": [{"tokens": 50}]}]
    path = write_jsonl(
        [
            HEADER,
            {"type": "request", "id": "m0", "session": "s", "t_s": 0.0,
             "input": {"mode": "full", "messages": user}, "output": {"tokens": 5}},
            {"type": "request", "id": "a0", "session": "s", "thread": "sa:1", "after": ["m0"],
             "t_s": 1.0, "input": {"mode": "full", "messages": [{"role": "user", "content": [
                 {"tokens": 900}]}]}, "output": {"tokens": 5}},
            {"type": "request", "id": "a1", "session": "s", "thread": "sa:1", "parent": "a0",
             "t_s": 2.0, "input": {"mode": "delta", "append": user}, "output": {"tokens": 5}},
            {"type": "request", "id": "m1", "session": "s", "parent": "m0", "after": ["m0", "a1"],
             "t_s": 3.0, "input": {"mode": "delta", "append": user}, "output": {"tokens": 5}},
        ]
    )  # fmt: skip
    sliced, report = slice_workload(read_workload(path), max_context=500)
    assert [r.id for r in sliced.requests] == ["m0", "m1"]
    assert sliced.requests[1].after is None  # the join on the dropped subagent is gone
    assert report.dropped["builds on a dropped request"] == 1


def test_measure_agrees_with_expand(write_jsonl: Callable[..., Path]) -> None:
    sample = Path(__file__).resolve().parents[2] / "workloads" / "sample-claudecode.jsonl"
    workload = read_workload(sample)
    sizes = measure(workload, WordTokenizer())
    for request in expand(workload).requests:
        assert sizes[request.id].prompt_tokens == request.prompt_tokens
        assert sizes[request.id].arrival_s == request.arrival_s


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real `autotune` command, under a permissive umask."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=scaled_timeout_s(60),
        preexec_fn=lambda: os.umask(0o022),
    )


def test_slice_filters_then_picks_sessions(
    write_jsonl: Callable[..., Path], tmp_path: Path
) -> None:
    # s1 and s2 arrive first but start with a prompt over the limit: nothing of them fits.
    records = [*_session("s1", 0, 2, 400), *_session("s2", 1, 2, 400)]
    for index in range(3, 7):
        records += _session(f"s{index}", index, 3, 100)
    path = write_jsonl([HEADER, *records])
    out = tmp_path / "small.jsonl"
    result = _cli("workload", "slice", str(path), str(out), "--sessions", "3",
                  "--max-context", "330", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept 9 requests in 3 sessions (3 sessions dropped)" in result.stdout
    sessions = {r.session for r in read_workload(out).requests}
    assert sessions == {"s3", "s4", "s5"}


def test_workload_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    generated = tmp_path / "cc.jsonl"
    generated.write_text("")
    generated.chmod(0o644)  # an older file in the way is replaced, not reused
    assert _cli("workload", "gen", "fixed", "--requests", "4", str(generated),
                cwd=tmp_path).returncode == 0  # fmt: skip
    assert _cli("workload", "slice", str(generated), cwd=tmp_path).returncode == 0
    for path in (generated, tmp_path / "cc.slice.jsonl"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
