"""Helpers for workload tests: write small JSONL fixtures, find the shared real data."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """$AUTOTUNE_SHARED_DATA, else ../shared/data relative to the repo root."""
    env = os.environ.get("AUTOTUNE_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def require_data(relative: str) -> Path:
    path = shared_data_dir() / relative
    if not path.exists():
        pytest.skip(f"real data {path} absent (set AUTOTUNE_SHARED_DATA)")
    return path


HEADER = {"type": "header", "format": "autotune-workload", "version": 1}


@pytest.fixture
def write_jsonl(tmp_path: Path) -> Callable[..., Path]:
    """Write records (dicts or raw strings) as a JSONL file; returns its path."""

    def write(records: list[dict[str, object] | str], name: str = "w.jsonl") -> Path:
        path = tmp_path / name
        lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
        path.write_text("\n".join(lines) + "\n")
        return path

    return write
