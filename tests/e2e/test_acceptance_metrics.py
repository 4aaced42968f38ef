"""Per-position MTP acceptance read from a real simulator process's /metrics, as from
vLLM's: ``vllm:spec_decode_num_accepted_tokens_per_pos`` (label ``position``) over
``vllm:spec_decode_num_drafts``, between a scrape before and one after the traffic."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from autotune.replay.metrics import server_stats_between
from autotune.sim.model.calibration_profile import CalibrationProfile, save_profile
from autotune.sim.model.speed_constants import DEFAULT_CONSTANTS
from tests.replay.conftest import free_port, wait_ready

pytestmark = pytest.mark.timeout(120)

# The second and third drafts rarely accepted: what readme-misled's truth does.
ACCEPTANCE = (0.9, 0.1, 0.05)


def test_per_position_acceptance_is_parsed_from_the_simulators_metrics(tmp_path: Path) -> None:
    profile = tmp_path / "acceptance.yaml"
    constants = DEFAULT_CONSTANTS.model_copy(update={"mtp_acceptance": ACCEPTANCE})
    save_profile(CalibrationProfile(constants=constants, source="test"), profile)
    port = free_port()
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 3})
    argv = [
        sys.executable, "-m", "autotune.sim", "serve", "qwen3.6-27b-awq",
        "--hardware", "rtx4080s-32g", "--kv-cache-memory-bytes", "9G",
        "--language-model-only", "--speculative-config", spec, "--calibration", str(profile),
        "--startup-s", "0", "--time-scale", "500", "--port", str(port),
    ]  # fmt: skip
    log = (tmp_path / "sim.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, timeout_s=60)
        before, after = asyncio.run(_traffic(url))
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=15)
        log.close()
    stats = server_stats_between(before, after)
    rates = stats.spec_decode_acceptance_per_position
    assert rates is not None and len(rates) == 3
    assert rates == pytest.approx(ACCEPTANCE, abs=0.03)
    assert stats.spec_decode_drafts and stats.spec_decode_drafts > 1000
    # One meaning: the mean acceptance length is 1 + the per-position rates' sum.
    assert stats.spec_decode_mean_acceptance_length == pytest.approx(1 + sum(rates), abs=1e-3)


async def _traffic(url: str) -> tuple[str, str]:
    """/metrics before and after four long generations."""
    body = {
        "model": "qwen3.6-27b-awq",
        "messages": [{"role": "user", "content": "write a long story"}],
        "max_tokens": 800,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        before = (await client.get("/metrics")).text
        done = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=body) for _ in range(4))
        )
        assert all(response.status_code == 200 for response in done)
        after = (await client.get("/metrics")).text
    return before, after
