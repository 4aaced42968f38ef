"""`autotune workload import` without --from: the format is read from the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import WorkloadError
from autotune.workload.io import read_workload
from tests.workload.conftest import require_data

SHAREGPT = [
    {"id": "x", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
]
REPO = Path(__file__).resolve().parents[2]
MOONCAKE = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}
OPENAI = {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                     {"role": "user", "content": "list files"}]}  # fmt: skip
ANTHROPIC = {"model": "m", "system": "be brief", "max_tokens": 9,
             "messages": [{"role": "user", "content": "list files"}]}  # fmt: skip


def run_import(*args: str) -> Result:
    """The real CLI app in-process: the same command, without an interpreter start each."""
    return CliRunner().invoke(app, ["workload", "import", *args], env={"COLUMNS": "200"})


@pytest.mark.parametrize(
    ("name", "text", "kind"),
    [
        ("m.jsonl", json.dumps(MOONCAKE) + "\n", "mooncake"),
        ("sg.json", json.dumps(SHAREGPT), "sharegpt"),
        ("o.jsonl", json.dumps(OPENAI) + "\n", "openai-log"),
        ("a.jsonl", json.dumps(ANTHROPIC) + "\n", "anthropic-log"),
    ],
)
def test_the_format_is_read_from_the_file(tmp_path: Path, name: str, text: str, kind: str) -> None:
    """Before: "Missing option '--from'"."""
    source = tmp_path / name
    source.write_text(text)
    result = run_import(str(source), str(tmp_path / "out.jsonl"))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert f"as {kind} (--from to override)" in result.stdout
    assert (tmp_path / "out.jsonl").exists()


def test_a_weka_trace_is_recognised(tmp_path: Path) -> None:
    source = require_data("claude-code-traces/trace_0247.json")
    result = run_import(str(source), str(tmp_path / "out.jsonl"))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "as weka" in result.stdout


def test_an_unknown_or_ambiguous_file_is_one_line_and_from_still_overrides(tmp_path: Path) -> None:
    unknown = tmp_path / "notes.txt"
    unknown.write_text("just some text\n")
    result = run_import(str(unknown), str(tmp_path / "out.jsonl"))
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "not a trace format autotune knows" in result.stderr and "--from" in result.stderr
    either = tmp_path / "log.jsonl"  # messages alone: OpenAI and Anthropic look the same
    either.write_text(json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
    result = run_import(str(either), str(tmp_path / "out.jsonl"))
    assert result.exit_code == 2 and "OpenAI or Anthropic" in result.stderr, result.stderr
    forced = run_import("--from", "openai-log", str(either), str(tmp_path / "out.jsonl"))
    assert forced.exit_code == 0, forced.stderr


@pytest.mark.parametrize(
    ("name", "text", "kind"),
    [
        (
            "weka.json",
            (REPO / "workloads/claude-code-traces-sample/sample_00.json").read_text(),
            "weka",
        ),
        ("mooncake.jsonl", json.dumps(MOONCAKE) + "\n", "mooncake"),
    ],
)
def test_a_trace_given_as_a_workload_says_to_import_it(
    tmp_path: Path, name: str, text: str, kind: str
) -> None:
    """`autotune run --workload` (and every reader of workload files) on a trace that
    `workload import` reads: the error names the format and the command, not the schema's
    missing record type."""
    trace = tmp_path / name
    trace.write_text(text)
    with pytest.raises(WorkloadError) as raised:
        read_workload(trace)
    message = str(raised.value)
    assert message.startswith(f"{trace}:1: type: a {kind} trace")
    assert f"autotune workload import {trace} OUT.jsonl" in message
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"x": 1}\n')
    with pytest.raises(WorkloadError) as raised:
        read_workload(junk)
    assert "import" not in str(raised.value)  # no format autotune knows: the schema's error
