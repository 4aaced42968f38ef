"""`autotune replay` parsing and output (typer's CliRunner; the server is the stub process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.workload.gen import fixed
from autotune.workload.io import write_workload
from tests.replay.conftest import StubFactory

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "fixed.jsonl"
    write_workload(path, fixed(requests=6, prompt_tokens=16, output_tokens=4).records())
    return path


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["replay", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sweep", "1,x"], "--sweep"),
        (["--sweep", "0,4"], "must be >= 1"),
        (["--mode", "trace", "--sweep", "1,4"], "trace mode"),
        (["--mode", "bogus"], "mode"),
        (["--duration", "soon"], "--duration"),
    ],
)
def test_bad_options_give_one_line_and_exit_2(
    workload: Path, extra: list[str], message: str
) -> None:
    code, output = _invoke("--url", "http://127.0.0.1:9", "-w", str(workload), *extra)
    assert code == 2 and message in output


def test_sweep_prints_one_row_per_level(stub_url: str, workload: Path) -> None:
    code, output = _invoke(
        "--url", stub_url, "-w", str(workload), "--mode", "concurrency", "--sweep", "1,3"
    )
    assert code == 0, output
    rows = [line for line in output.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["1", "3"]


def test_single_run_summary_and_json(stub_url: str, workload: Path) -> None:
    code, output = _invoke("--url", stub_url, "-w", str(workload), "--mode", "concurrency")
    assert code == 0, output
    assert "6 completed, 0 failed" in output and "generation tokens 24" in output
    code, output = _invoke(
        "--url", stub_url, "-w", str(workload), "--mode", "concurrency", "--json"
    )
    assert code == 0, output
    [level] = json.loads(output)
    assert level["result"]["stats"]["total_output_tokens"] == 24
    assert "records" not in level["result"]


def test_api_key_comes_from_the_environment_and_is_never_printed(
    stub_server: StubFactory, workload: Path
) -> None:
    url = stub_server(api_key="sk-do-not-print")
    argv = ["replay", "--url", url, "-w", str(workload), "--mode", "concurrency", "--json"]
    result = CliRunner().invoke(app, argv, env={"VLLM_API_KEY": "sk-do-not-print"})
    assert result.exit_code == 0 and "sk-do-not-print" not in result.output
    assert json.loads(result.output)[0]["result"]["stats"]["failed"] == 0
    refused = CliRunner().invoke(app, argv, env={"VLLM_API_KEY": "", "OPENAI_API_KEY": ""})
    assert json.loads(refused.output)[0]["result"]["stats"]["errors_by_class"] == {"http-4xx": 6}


def test_a_never_ending_sse_line_fails_its_request_as_line_too_long(
    stub_server: StubFactory, workload: Path
) -> None:
    """Before: the replay buffered the line without end (527 MB after 300 s)."""
    url = stub_server(endless_line="")
    argv = ["replay", "--url", url, "-w", str(workload), "--mode", "concurrency", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *argv], capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)[0]["result"]["stats"]
    assert stats["errors_by_class"] == {"line-too-long": 6}
