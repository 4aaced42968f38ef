"""One contract suite for every engine (as Optuna runs one storage suite over every storage).

A test module subclasses ``EngineContract`` and provides four fixtures:
``engine`` (a BaseEngine), ``base_config`` (a TrialConfig that starts),
``running`` (a ``RunningServer`` of it shared by the module: one startup per
engine, as a real vLLM takes tens of seconds to start) and
``impossible_config`` (a TrialConfig whose KV cache cannot fit).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from autotune.config.trial_config import TrialConfig
from autotune.engines.base import BaseEngine, Server
from autotune.errors import ServerStartFailed
from autotune.vocabulary import FailureClass


def session_members(session_id: int) -> list[int]:
    """Live processes of a session, read from /proc by the test itself."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[3]) == session_id and fields[0] != "Z":
            members.append(int(entry.name))
    return members


class RunningServer:
    """A server launched once and held open across tests (own event loop)."""

    def __init__(self, engine: BaseEngine, config: TrialConfig, log_path: Path, timeout_s: float):
        self.phases: list[str] = []
        self.loop = asyncio.new_event_loop()
        self._context = engine.launch(
            config, log_path=log_path, startup_timeout_s=timeout_s, on_phase=self.phases.append
        )
        self.server: Server = self.loop.run_until_complete(self._context.__aenter__())
        self.session_id: int = self.server.process.pid  # type: ignore[attr-defined]
        self.members_while_running = session_members(self.session_id)
        self.stopped = False

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.run(self._context.__aexit__(None, None, None))
            self.loop.close()


def launch_failure(engine: BaseEngine, config: TrialConfig, log_path: Path, timeout_s: float):
    async def go():
        async with engine.launch(config, log_path=log_path, startup_timeout_s=timeout_s):
            pass

    with pytest.raises(ServerStartFailed) as caught:
        asyncio.run(go())
    return caught.value.failure


class EngineContract:
    startup_timeout_s = 180.0

    def test_version_and_hardware(self, engine):
        assert engine.version()
        hardware = engine.hardware()
        assert hardware.gpu_name
        assert hardware.source in {"nvml", "cpu", "simulator"}

    def test_startup_report(self, running):
        report = running.server.report
        assert report.kv_cache_tokens and report.kv_cache_tokens > 0
        assert report.device in {"GPU", "CPU"}
        assert report.max_concurrency and report.max_concurrency > 0
        assert report.engine_version
        assert report.ready_s and report.ready_s > 0
        assert report.block_size  # cross-checked against vllm:cache_config_info
        assert report.kv_cache_blocks * report.block_size >= report.kv_cache_tokens * 0.9
        assert running.phases[0] == "launching"
        assert running.phases[-1] == "ready"

    def test_health_models_and_log(self, running):
        server = running.server
        headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
        with httpx.Client(base_url=server.url, trust_env=False, timeout=30) as client:
            assert client.get("/health").status_code == 200
            models = client.get("/v1/models", headers=headers).json()
        assert models["data"][0]["id"] == server.served_model_name
        assert server.url.startswith("http://127.0.0.1:")
        assert "KV cache size" in server.log_path.read_text()
        assert server.time_scale >= 1

    def test_no_failure_while_serving(self, running):
        assert running.server.poll_failure() is None

    def test_server_runs_in_its_own_session(self, running):
        assert running.session_id in running.members_while_running

    def test_stop_leaves_no_process(self, running):
        # Runs last in the class (definition order): it stops the shared server.
        assert len(running.members_while_running) >= 1
        started = time.monotonic()
        running.stop()
        assert time.monotonic() - started < 15
        assert session_members(running.session_id) == []
        assert running.server.poll_failure() is None  # a requested stop is no failure

    def test_impossible_kv_cache_is_classified(self, engine, impossible_config, tmp_path):
        started = time.monotonic()
        log_path = tmp_path / "kv.log"
        failure = launch_failure(engine, impossible_config, log_path, self.startup_timeout_s)
        assert failure.failure_class == FailureClass.KV_DOES_NOT_FIT
        assert failure.failure_class.is_oom
        assert "memory" in failure.message
        assert failure.log_excerpt
        assert time.monotonic() - started < self.startup_timeout_s  # ended on the log line

    def test_rejected_argument_is_invalid_args(self, engine, base_config, tmp_path):
        flags = {**base_config.flags, "max-num-seqs": "many"}
        config = base_config.model_copy(update={"flags": flags})
        failure = launch_failure(engine, config, tmp_path / "args.log", self.startup_timeout_s)
        assert failure.failure_class == FailureClass.INVALID_ARGS
        assert failure.exit_code == 2
        assert "many" in failure.message
