"""launch_process_server against the stand-in server: early failure, report, death while serving."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from autotune.engines.launcher import launch_process_server
from autotune.errors import ServerStartFailed
from autotune.vocabulary import FailureClass
from tests.engines.contract import session_members

pytestmark = pytest.mark.timeout(60)

STAND_IN = Path(__file__).with_name("stand_in_server.py")


def launch(tmp_path: Path, *extra: str, phases: list[str] | None = None, timeout_s=30.0):
    return launch_process_server(
        lambda port: [sys.executable, str(STAND_IN), str(port), *extra],
        env=dict(os.environ),
        log_path=tmp_path / "server.log",
        startup_timeout_s=timeout_s,
        on_phase=None if phases is None else phases.append,
        time_scale=1.0,
        api_key=None,
        notes=["a gate note"],
    )


def test_fatal_log_line_ends_the_wait_before_the_process_exits(tmp_path):
    message = "ValueError: No available memory for the cache blocks. Try increasing it."

    async def go():
        async with launch(tmp_path, "--fail", message, "--linger", "40"):
            pass

    started = time.monotonic()
    with pytest.raises(ServerStartFailed) as caught:
        asyncio.run(go())
    elapsed = time.monotonic() - started
    failure = caught.value.failure
    assert failure.failure_class == FailureClass.KV_DOES_NOT_FIT
    assert failure.message == message
    assert failure.exit_code is None  # still lingering when we gave up on it
    assert elapsed < 20  # not the 40 s the server would have taken to exit
    log = (tmp_path / "server.log").read_text()
    assert log.startswith("# autotune: argv: ")
    assert "# autotune: a gate note" in log


def test_ready_server_then_killed_is_engine_dead(tmp_path):
    phases: list[str] = []

    async def go():
        async with launch(tmp_path, phases=phases) as server:
            assert server.served_model_name == "stand-in"
            assert server.report.kv_cache_tokens == 4096
            assert server.report.device == "CPU"
            assert server.report.ready_s > 0
            assert server.poll_failure() is None
            session = server.process.pid
            os.kill(session, signal.SIGKILL)  # the API server dies; its child lives on
            for _ in range(100):
                if server.poll_failure() is not None:
                    break
                await asyncio.sleep(0.05)
            return server.poll_failure(), session

    failure, session = asyncio.run(go())
    assert failure.failure_class == FailureClass.ENGINE_DEAD
    assert failure.exit_code == -signal.SIGKILL
    assert failure.seconds > 0
    assert phases[0] == "launching" and phases[-1] == "ready"
    assert "kv cache allocated" in phases
    assert session_members(session) == []  # the orphaned child went with the session
