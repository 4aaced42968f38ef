"""`autotune sim memory | predict | serve` through typer's CliRunner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from autotune.cli import app

runner = CliRunner()


def test_memory_json_reports_calibrated_capacity() -> None:
    result = runner.invoke(
        app,
        [
            "sim",
            "memory",
            "--hardware",
            "rtx4080s-32g",
            "--model",
            "qwen3.6-27b-awq",
            "--kv-cache-memory-bytes",
            "9G",
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--language-model-only",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["fits"] is True
    assert report["kv_cache_tokens"] == 220_013
    assert report["kv_cache_bytes"] == 9 * 2**30
    assert report["weights_bytes"] > 18 * 2**30


def test_memory_table_names_the_failure() -> None:
    result = runner.invoke(app, ["sim", "memory", "--kv-cache-memory-bytes", "14G"])
    assert result.exit_code == 0
    assert "cuda-oom-startup" in result.stdout


def test_memory_rejects_a_bad_size_in_one_line() -> None:
    result = runner.invoke(app, ["sim", "memory", "--kv-cache-memory-bytes", "1.5G"])
    assert result.exit_code == 2
    assert "--kv-cache-memory-bytes" in result.stderr


def test_predict_json_rows_cover_the_grid() -> None:
    result = runner.invoke(
        app,
        [
            "sim",
            "predict",
            "--hardware",
            "h100-80g",
            "--model",
            "llama-3.1-8b",
            "--concurrency",
            "1,4",
            "--mtp",
            "0,1",
            "--prompt-tokens",
            "64",
            "--output-tokens",
            "32",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    cells = {(row["concurrency"], row["mtp"]): row for row in payload["rows"]}
    assert set(cells) == {(1, 0), (1, 1), (4, 0), (4, 1)}
    assert cells[4, 0]["output_tokens_per_s"] > cells[1, 0]["output_tokens_per_s"]
    assert all(row["mean_latency_s"] > 0 for row in payload["rows"])


def test_predict_unknown_model_is_one_line() -> None:
    result = runner.invoke(app, ["sim", "predict", "--model", "nope", "--json"])
    assert result.exit_code == 2
    assert "simulator model catalog" in result.stderr


def test_serve_passes_flags_to_the_server() -> None:
    result = runner.invoke(app, ["sim", "serve", "qwen3.6-27b-awq", "--no-such-flag"])
    assert result.exit_code == 2


def test_serve_help_shows_the_servers_own_flags() -> None:
    result = runner.invoke(app, ["sim", "serve", "--help"])
    assert result.exit_code == 0, result.output
    for flag in ("--hardware", "--max-num-seqs", "--kv-cache-memory-bytes", "--time-scale"):
        assert flag in result.stdout


def test_predict_marks_cells_vllm_would_reject() -> None:
    grid = ["--concurrency", "1", "--mtp", "0,1", "--output-tokens", "16", "--json"]
    result = runner.invoke(
        app, ["sim", "predict", "--hardware", "h100-80g", "--model", "qwen3-32b-awq", *grid]
    )
    assert result.exit_code == 0, result.output
    rows = {row["mtp"]: row for row in json.loads(result.stdout)["rows"]}
    assert rows[0]["failure"] is None and rows[0]["output_tokens_per_s"] > 0
    assert rows[1]["failure"].startswith("invalid-args: Unsupported speculative method")
