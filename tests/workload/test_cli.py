from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from autotune.cli import app

runner = CliRunner()


def test_gen_fixed_then_stats_json(tmp_path: Path) -> None:
    out = tmp_path / "fixed.jsonl"
    result = runner.invoke(
        app, ["workload", "gen", "fixed", "--requests", "5", "--prompt-tokens", "32", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "5 requests" in result.output
    result = runner.invoke(app, ["workload", "stats", str(out), "--json", "--block-size", "8"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["requests"] == 5 and stats["input_tokens"]["p50"] == 32
    assert stats["prefix_hit_ratio"] == 0.0 and stats["block_size"] == 8


def test_import_prints_what_was_dropped(tmp_path: Path) -> None:
    source = tmp_path / "sg.json"
    source.write_text(
        json.dumps(
            [
                {"id": "a", "conversations": [{"from": "human", "value": "q"},
                                              {"from": "gpt", "value": "a"}]},
                {"id": "b"},
            ]
        )
    )  # fmt: skip
    out = tmp_path / "sg.jsonl"
    result = runner.invoke(app, ["workload", "import", "--from", "sharegpt", str(source), str(out)])
    assert result.exit_code == 0, result.output
    assert "2 conversations" in result.output
    assert "1 x conversation without a 'conversations' list" in result.output
    assert out.exists()


def test_bad_workload_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"type": "header", "version": 1}\n{"type": "request", "id": 3}\n')
    result = runner.invoke(app, ["workload", "stats", str(path)])
    assert result.exit_code == 2
    assert f"{path}:2: id: " in result.output.replace("\n", "")


def test_slice_writes_next_to_the_input_by_default(tmp_path: Path) -> None:
    source = Path(__file__).resolve().parents[2] / "workloads" / "sample-claudecode.jsonl"
    copy = tmp_path / "sample.jsonl"
    copy.write_bytes(source.read_bytes())
    result = runner.invoke(app, ["workload", "slice", str(copy), "--sessions", "2"])
    assert result.exit_code == 0, result.output
    assert "sessions dropped" in result.output
    sliced = tmp_path / "sample.slice.jsonl"
    sessions = {json.loads(line).get("session") for line in sliced.read_text().splitlines()}
    assert sessions - {None} == {"s00", "s01"}
