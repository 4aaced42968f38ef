"""VllmEngine's command line and version probe, with a stand-in `vllm` executable."""

from __future__ import annotations

import pytest

from autotune.config.trial_config import TrialConfig
from autotune.engines import VllmEngine, make_engine
from autotune.errors import EngineError


@pytest.fixture
def fake_vllm(tmp_path):
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\necho 'INFO some import chatter'\necho 0.33.0\n")
    script.chmod(0o755)
    return script


def test_version_from_the_executable(fake_vllm):
    engine = VllmEngine(executable=str(fake_vllm))
    assert engine.version() == "0.33.0"
    assert engine.name == "vllm"


def test_argv_is_gated_for_the_version(fake_vllm):
    engine = VllmEngine(executable=str(fake_vllm), host="127.0.0.1", extra_args=["--seed", "1"])
    config = TrialConfig(
        model="Qwen/Qwen3.6-27B-AWQ",
        flags={"kv-cache-memory-bytes": "9G", "mamba-cache-mode": "align", "max-num-seqs": 8},
    )
    argv, notes = engine.argv(config, 8123)
    assert argv[:3] == [str(fake_vllm), "serve", "Qwen/Qwen3.6-27B-AWQ"]
    assert "--mamba-cache-mode" not in argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "9G"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[-2:] == ["--seed", "1"]
    assert len(notes) == 1 and "mamba-cache-mode" in notes[0]


def test_missing_executable_is_an_engine_error(tmp_path):
    with pytest.raises(EngineError, match="not found"):
        make_engine("vllm", executable=str(tmp_path / "no-vllm-here"))


def test_unreadable_version_is_an_engine_error(tmp_path):
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\necho nonsense\nexit 1\n")
    script.chmod(0o755)
    with pytest.raises(EngineError, match="cannot tell the vLLM version"):
        VllmEngine(executable=str(script)).version()
