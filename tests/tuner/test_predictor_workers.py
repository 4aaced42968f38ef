"""The warm start's prediction workers die with autotune, even on kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A real process predicting a slow workload on worker processes, as the warm start does.
PREDICTING = """
from pathlib import Path
from autotune.trial.objective import Goal
from autotune.replay.load import LoadSpec
from autotune.config.trial_config import TrialConfig
from autotune.tuner.predictor import SimOracle, predict_all
from autotune.workload.expand import load_plan

plan = load_plan(Path({workload!r}))
oracle = SimOracle(
    hardware="rtx4080s-32g", sim_model="qwen3.6-27b-awq", plan=plan,
    load=LoadSpec(concurrency=4), goal=Goal(objectives=["throughput"], slos=[]),
)
configs = [
    TrialConfig(model="qwen3.6-27b-awq", flags={{
        "max-model-len": 40000, "enable-prefix-caching": True, "language-model-only": True,
        "kv-cache-memory-bytes": f"{{gib}}G", "max-num-seqs": seqs,
    }})
    for gib in range(6, 14) for seqs in (1, 2, 4, 8, 16, 32, 48, 64)
]
predict_all(oracle, configs * 4, workers=2)
"""


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_prediction_workers_die_when_autotune_is_killed() -> None:
    script = PREDICTING.format(workload=str(REPO / "workloads" / "sample-claudecode.jsonl"))
    process = subprocess.Popen([sys.executable, "-c", script], env={**os.environ})
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
            workers = _children(process.pid)
        assert len(workers) >= 2, "the predictor never started its worker processes"
        process.send_signal(signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if _alive(w)], "prediction workers outlived autotune"
    finally:
        process.kill()
        for worker in workers:
            if _alive(worker):
                os.kill(worker, signal.SIGKILL)


# Ctrl-C exactly while the workers fork: the parent's fork hook is where it lands.
INTERRUPTED_AT_FORK = """
import os, signal, sys
os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGINT))
try:
{predicting}
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork hook is POSIX")
def test_ctrl_c_while_the_workers_fork_is_not_lost() -> None:
    predicting = PREDICTING.format(workload=str(REPO / "workloads" / "sample-claudecode.jsonl"))
    predicting = predicting.replace("configs * 4", "configs[:64]")
    indented = "\n".join("    " + line for line in predicting.splitlines())
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AT_FORK.format(predicting=indented)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr[-2000:]
