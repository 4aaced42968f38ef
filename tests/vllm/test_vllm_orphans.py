"""kill -9 of autotune mid-trial leaves no vLLM process (API server, EngineCore, worker).

Killed while vLLM loads the model: the hardest moment, where PR_SET_PDEATHSIG alone
left 4 processes behind (scripts/measure_engine_guards.py) and the watchdog is needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.engines.contract import session_members
from tests.vllm.conftest import VLLM_EXECUTABLE, tiny_config

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PARENT = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from autotune.engines import VllmEngine
    from autotune.config.trial_config import TrialConfig

    def server_pid():
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
                if ppid == os.getpid() and b"serve" in cmdline:
                    return int(entry.name)

    def on_phase(phase):
        if phase == "loading model":  # EngineCore and worker exist, vLLM is mid-startup
            print(server_pid(), flush=True)

    async def main():
        engine = VllmEngine(executable=sys.argv[1], env={"HF_HUB_OFFLINE": "1"})
        config = TrialConfig.model_validate_json(sys.argv[2])
        log_path = Path(sys.argv[3])
        async with engine.launch(config, log_path=log_path, startup_timeout_s=240,
                                 on_phase=on_phase):
            await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def test_kill_9_mid_trial_leaves_no_vllm_process(tmp_path):
    config = tiny_config().model_dump_json()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(VLLM_EXECUTABLE), config, str(tmp_path / "v.log")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "cache")},
    )
    session = 0
    try:
        session = int(parent.stdout.readline())
        members = session_members(session)
        assert len(members) >= 2, members  # API server + EngineCore (+ worker)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 20
        while session_members(session) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session_members(session) == []
    finally:
        parent.kill()
        if session:
            for pid in session_members(session):
                os.kill(pid, signal.SIGKILL)
