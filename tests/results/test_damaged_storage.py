"""A damaged SQLite study file: every command says so in one line and leaves it as it is.

Two kinds of damage a disk or a copy can do: a file that is not a database at all,
and a real study whose pages were overwritten past the header.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
PAGE_BYTES = 4096


def garbage(path: Path) -> Path:
    path.write_bytes(random.Random(1).randbytes(20 * PAGE_BYTES))
    return path


def overwritten_pages(path: Path, study_url: str) -> Path:
    """The fixture study with every page after the first scribbled over."""
    shutil.copy(study_url.removeprefix("sqlite:///"), path)
    data = bytearray(path.read_bytes())
    for index in range(PAGE_BYTES, len(data), 7):
        data[index] = 0xAB
    path.write_bytes(bytes(data))
    return path


COMMANDS = [
    ["show"],
    ["studies"],
    ["export"],
    ["report", "--out", "{dir}/r.html"],
    ["explain"],
    ["compare", "qwen-4080"],
    [
        "run", "--workload", str(WORKLOAD), "--engine", "sim", "--hardware", "rtx4080s-32g",
        "--model", "qwen3.6-27b-awq", "--trials", "1", "--sampler", "random",
    ],
]  # fmt: skip


@pytest.mark.parametrize("damage", ["garbage", "overwritten"])
@pytest.mark.parametrize("command", COMMANDS, ids=[command[0] for command in COMMANDS])
def test_a_damaged_study_file_is_one_line_naming_it_and_is_left_untouched(
    tmp_path: Path, study_url: str, damage: str, command: list[str]
) -> None:
    db = tmp_path / "studies.db"
    garbage(db) if damage == "garbage" else overwritten_pages(db, study_url)
    before = db.read_bytes()
    args = [arg.replace("{dir}", str(tmp_path)) for arg in command]
    result = CliRunner().invoke(app, [*args, "--storage", f"sqlite:///{db}"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: ") and f"{db} is damaged" in line, line
    assert "restore it from a backup" in line and ".recover" in line, line
    assert "[SQL:" not in line and "sqlalche.me" not in line, line
    assert db.read_bytes() == before  # nothing written over what may still be salvaged
    assert not (tmp_path / "r.html").exists()
