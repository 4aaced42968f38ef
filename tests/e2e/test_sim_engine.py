"""The engine contract against the simulator process, plus failures only the simulator can fake."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys

import httpx
import pytest

from autotune.config.trial_config import TrialConfig
from autotune.engines import SimEngine, make_engine
from autotune.errors import InputError
from autotune.vocabulary import FailureClass
from tests.engines.contract import EngineContract, RunningServer, launch_failure

pytestmark = pytest.mark.timeout(120)

HARDWARE = "rtx4080s-32g"
MODEL = "llama-3.1-8b"


def sim_config(**flags) -> TrialConfig:
    base = {"kv-cache-memory-bytes": "4G", "max-num-seqs": 8, "max-model-len": 8192}
    return TrialConfig(model=MODEL, flags={**base, **flags})


@pytest.fixture(scope="module")
def engine():
    return SimEngine(hardware=HARDWARE, time_scale=50)


@pytest.fixture
def base_config():
    return sim_config()


@pytest.fixture
def impossible_config():
    return sim_config(**{"kv-cache-memory-bytes": 1000})


@pytest.fixture(scope="module")
def running(engine, tmp_path_factory):
    handle = RunningServer(
        engine, sim_config(), tmp_path_factory.mktemp("sim") / "server.log", 60.0
    )
    yield handle
    handle.stop()


class TestSimEngine(EngineContract):
    startup_timeout_s = 60.0

    def test_identity(self, engine, running):
        assert engine.version().startswith("autotune-sim ")
        hardware = engine.hardware()
        assert (hardware.gpu_name, hardware.source) == (HARDWARE, "simulator")
        assert hardware.memory_bytes > 30 * 1024**3
        assert running.server.time_scale == 50
        assert running.server.served_model_name == MODEL


def test_argv_is_vllm_serve_shaped():
    engine = SimEngine(hardware=HARDWARE, time_scale=20, seed=7, extra_args=["--noise", "0"])
    argv = engine.argv(sim_config(), 8123)
    assert argv[:5] == [sys.executable, "-m", "autotune.sim", "serve", MODEL]
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "4G"
    assert argv[argv.index("--time-scale") + 1] == "20"
    assert argv[argv.index("--seed") + 1] == "7"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[-2:] == ["--noise", "0"]


def test_bad_engine_options_are_input_errors():
    with pytest.raises(InputError, match="no-such-gpu"):
        SimEngine(hardware="no-such-gpu")
    with pytest.raises(InputError, match="time_scale"):
        SimEngine(hardware=HARDWARE, time_scale=0)
    with pytest.raises(InputError, match="engine must be one of sim, vllm"):
        make_engine("tgi")
    with pytest.raises(InputError, match="unexpected keyword"):
        make_engine("sim", hardware=HARDWARE, colour="blue")
    assert isinstance(make_engine("sim", hardware=HARDWARE), SimEngine)


def test_hang_is_a_startup_timeout(tmp_path):
    engine = SimEngine(hardware=HARDWARE, time_scale=50, extra_args=["--fault-hang-at-startup"])
    failure = launch_failure(engine, sim_config(), tmp_path / "hang.log", 4.0)
    assert failure.failure_class == FailureClass.STARTUP_TIMEOUT
    assert "not ready after 4 s" in failure.message
    assert failure.seconds >= 4.0


def test_taken_port_is_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # argparse keeps the last --port: every retry lands on the taken port.
        engine = SimEngine(hardware=HARDWARE, time_scale=50, extra_args=["--port", str(port)])
        failure = launch_failure(engine, sim_config(), tmp_path / "port.log", 30.0)
    assert failure.failure_class == FailureClass.PORT_IN_USE


def test_crash_while_serving_is_engine_dead(tmp_path):
    engine = SimEngine(
        hardware=HARDWARE, time_scale=50, extra_args=["--fault-crash-after-requests", "1"]
    )

    async def go():
        async with engine.launch(
            sim_config(), log_path=tmp_path / "crash.log", startup_timeout_s=60
        ) as server:
            body = {
                "model": server.served_model_name,
                "prompt": "hello there",
                "max_tokens": 4,
            }
            async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
                for _ in range(3):
                    with contextlib.suppress(httpx.HTTPError):
                        await client.post("/v1/completions", json=body, timeout=10)
            for _ in range(100):
                failure = server.poll_failure()
                if failure is not None:
                    return failure
                await asyncio.sleep(0.1)
            return None

    failure = asyncio.run(go())
    assert failure is not None
    assert failure.failure_class in {FailureClass.ENGINE_DEAD, FailureClass.CUDA_OOM_LOAD}
    assert failure.log_excerpt
