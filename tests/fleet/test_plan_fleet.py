"""The planned fleet, replayed on that many simulated servers side by side (real processes
on real ports, sessions routed round robin as the plan states), meets the SLO; one
replica fewer does not."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from autotune.config.trial_config import TrialConfig
from autotune.engines.sim import SimEngine
from autotune.fleet.routing import split_load, split_plan
from autotune.replay.load import LoadSpec
from autotune.replay.records import ReplayStats
from autotune.replay.runner import replay
from autotune.replay.stats import compute_stats
from autotune.workload.expand import load_plan
from autotune.workload.plan import WorkloadPlan

pytestmark = [pytest.mark.timeout(300)]

GPU = "rtx4080s-32g"
MODEL = "qwen3.6-27b-awq"
SESSIONS = 8
SLO_TTFT_P95_S = 14.0
TIME_SCALE = 20.0


def autotune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=240
    )


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A README-like agent workload (the README's model and GPU), and its plan."""
    folder = tmp_path_factory.mktemp("plan")
    workload = folder / "agents.jsonl"
    made = autotune(
        "workload", "gen", "claudecode", "--sessions", str(SESSIONS), "--seed", "2",
        "--requests-per-session", "3", "--prefix-tokens", "4000", "--max-context", "12000",
        str(workload),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    done = autotune(
        "plan", str(workload), "--model", MODEL, "--gpu", GPU, "--sessions", str(SESSIONS),
        "--slo", f"ttft_p95<={SLO_TTFT_P95_S:g}s",
        "--out", str(folder / "out"), "--storage", str(folder / "studies" / "autotune.db"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return workload, json.loads((folder / "out" / "plan.json").read_text())


async def _replay_fleet(
    config: TrialConfig, replicas: int, plan: WorkloadPlan, load: LoadSpec, logs: Path
) -> ReplayStats:
    """``replicas`` simulated servers, each replaying its sessions (the plan's router)."""
    engine = SimEngine(hardware=GPU, time_scale=TIME_SCALE)
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(
                engine.launch(config, log_path=logs / f"{replicas}-{i}.log", startup_timeout_s=60)
            )
            for i in range(replicas)
        ]
        assert len({server.url for server in servers}) == replicas
        replayed = await asyncio.gather(
            *(
                replay(
                    url=server.url,
                    plan=sub_plan,
                    load=sub_load,
                    model_name=server.served_model_name,
                    server_time_scale=server.time_scale,
                    lockstep=server.lockstep,
                    scrape_interval_s=None,
                )
                for server, sub_plan, sub_load in zip(
                    servers, split_plan(plan, replicas), split_load(load, replicas), strict=True
                )
            )
        )
    records = sorted((r for result in replayed for r in result.records), key=lambda r: r.send_s)
    return compute_stats(records)


def test_the_planned_fleet_meets_the_slo_and_one_replica_fewer_does_not(
    planned: tuple[Path, dict], tmp_path: Path
) -> None:
    workload, plan_record = planned
    winner = plan_record["candidates"][0]
    replicas = winner["replicas"]
    assert winner["gpu"] == GPU and replicas >= 2, winner
    config = TrialConfig.model_validate(winner["config"])
    plan = load_plan(workload)
    load = LoadSpec.model_validate(plan_record["load"])
    fleet = asyncio.run(_replay_fleet(config, replicas, plan, load, tmp_path))
    fewer = asyncio.run(_replay_fleet(config, replicas - 1, plan, load, tmp_path))
    print(f"predicted {winner['ttft_p95_s']:.2f} s; {replicas}: {fleet.ttft.p95:.2f} s; "
          f"{replicas - 1}: {fewer.ttft.p95:.2f} s")  # fmt: skip
    assert fleet.failed == 0 and fleet.completed == len(plan.requests)
    assert fleet.ttft.p95 is not None and fleet.ttft.p95 <= SLO_TTFT_P95_S
    assert fewer.ttft.p95 is not None and fewer.ttft.p95 > SLO_TTFT_P95_S


def test_the_plan_says_how_far_each_gpus_speed_was_checked(planned: tuple[Path, dict]) -> None:
    workload, _ = planned
    html = (workload.parent / "out" / "plan.html").read_text()
    assert f"{GPU}: no published run checked; constants: " in html
