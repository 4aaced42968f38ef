"""Every count in a workload file is bounded when the file is read: a 1e12-token count is
one line naming the file, line and field (exit 2), never a MemoryError; and a slice that
keeps nothing says why instead of writing an empty workload."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import WorkloadError
from autotune.workload import load_plan
from autotune.workload.schema import MAX_TOKENS
from tests.workload.conftest import HEADER

REPO = Path(__file__).resolve().parents[2]
HUGE = 10**12


def _request(rid: str = "r", **overrides: object) -> dict[str, object]:
    record: dict[str, object] = {
        "type": "request",
        "id": rid,
        "input": {"mode": "full", "messages": [{"role": "user", "content": "hello there"}]},
        "output": {"tokens": 8},
    }
    return record | overrides


SYNTH = [{"role": "user", "content": [{"tokens": HUGE}]}]
CASES = {
    "output.tokens": ([HEADER, _request(output={"tokens": HUGE})], 2),
    "input.messages.0.content.0.tokens": (
        [HEADER, _request(input={"mode": "full", "messages": SYNTH})],
        2,
    ),
    "input.tokens": (
        [HEADER, _request(input={"mode": "blocks", "hash_ids": [1], "tokens": HUGE})],
        2,
    ),
    "block_size": ([HEADER | {"block_size": HUGE}, _request()], 1),
    "system.0.tokens": (
        [HEADER, {"type": "prefix", "id": "p", "system": [{"tokens": HUGE}]}, _request(prefix="p")],
        2,
    ),
    "gap_s": ([HEADER, _request(gap_s=1e12)], 2),
}


@pytest.mark.parametrize(("field", "case"), CASES.items(), ids=list(CASES))
def test_a_huge_count_is_refused_naming_file_line_and_field(
    write_jsonl: Callable[..., Path], field: str, case: tuple[list, int]
) -> None:
    records, line = case
    path = write_jsonl(records)
    result = CliRunner().invoke(app, ["workload", "stats", str(path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"{path}:{line}: {field}: " in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["stats", "slice", "run"])
def test_stats_slice_and_run_refuse_a_1e12_output_in_one_line(
    tmp_path: Path, write_jsonl: Callable[..., Path], command: str
) -> None:
    """Before: `stats` and `run` ended in a MemoryError traceback, `slice` wrote the file."""
    path = write_jsonl([HEADER, _request("a"), _request("b", output={"tokens": HUGE})])
    args = {
        "stats": ["workload", "stats", str(path)],
        "slice": ["workload", "slice", str(path), str(tmp_path / "out.jsonl")],
        "run": ["run", "--workload", str(path), "--engine", "sim", "--hardware",
                "rtx4080s-32g", "--model", "qwen3.6-27b-awq",
                "--storage", f"sqlite:///{tmp_path / 'a.db'}"],
    }[command]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{path}:3: output.tokens: 1,000,000,000,000 is past the bound" in done.stderr
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "a.db").exists()


def test_a_delta_chain_whose_context_adds_up_past_the_bound_names_its_line(
    write_jsonl: Callable[..., Path],
) -> None:
    """Each count is within the bound; the third turn's history is not."""
    half = MAX_TOKENS // 2
    turn = {"mode": "delta", "append": [{"role": "user", "content": "go on"}]}
    records = [
        HEADER,
        _request("t0", output={"tokens": half}),
        _request("t1", parent="t0", input=turn, output={"tokens": half - 100}, gap_s=3600),
    ]
    within = load_plan(write_jsonl(records, "within.jsonl"))  # the longest real contexts pass
    assert [r.output_tokens for r in within.requests] == [half, half - 100]
    path = write_jsonl([*records, _request("t2", parent="t1", input=turn, output={"tokens": 200})])
    with pytest.raises(WorkloadError, match=rf"^{path}:4: output.tokens: the context, [\d,]+ "):
        load_plan(path)


def _chat(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    result = CliRunner().invoke(app, ["workload", "gen", "chat", "--requests", "12",
                                      "--seed", "2", str(path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    return path


def test_a_slice_that_keeps_nothing_is_an_error_naming_the_longest_request(
    tmp_path: Path,
) -> None:
    """Before: exit 0 and an empty workload, which `run` then refused."""
    source = _chat(tmp_path)
    sizes = {}
    for line in source.read_text().splitlines()[1:]:
        record = json.loads(line)
        prompt = sum(part["tokens"] for m in record["input"]["messages"] for part in m["content"])
        sizes[record["id"]] = prompt + record["output"]["tokens"]
    longest = max(sizes, key=sizes.__getitem__)
    out = tmp_path / "empty.jsonl"
    result = CliRunner().invoke(app, ["workload", "slice", str(source), str(out),
                                      "--max-context", "10"])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert not out.exists()
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert f"the longest request, {longest}, needs {sizes[longest]:,} tokens" in message
    shortest = min(sizes.values())
    assert f"--max-context {shortest} or more keeps" in message
    kept = CliRunner().invoke(app, ["workload", "slice", str(source), str(out),
                                    "--max-context", str(shortest)])  # fmt: skip
    assert kept.exit_code == 0, kept.output
    assert "kept 1 requests" in kept.output
