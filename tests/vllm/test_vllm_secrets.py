"""A real vLLM demanding an API key: the key is in no file the study produced.

vLLM takes the key from ``--api-key`` or ``VLLM_API_KEY`` alike; autotune refuses
it as a flag (a flag is stored with every trial), so it travels in the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.workload.gen import fixed
from autotune.workload.io import write_workload
from tests.e2e.conftest import tuner_args
from tests.e2e.test_secrets import files_holding
from tests.vllm.conftest import TINY_MODEL, VLLM_EXECUTABLE

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

SPACE = Path(__file__).with_name("tiny-space.yaml")
SECRET = "sk-vllm-secret-5e4d3c2b1a"


def test_a_keyed_vllm_study_stores_the_key_nowhere(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    workload = run_dir / "small.jsonl"
    small = fixed(requests=4, prompt_tokens=32, output_tokens=16)
    write_workload(workload, [small.header, *small.requests])
    db = run_dir / "study.db"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
        "VLLM_API_KEY": SECRET,
    }
    argv = [
        sys.executable, "-m", "autotune", "run",
        "--engine", "vllm",
        "--model", str(TINY_MODEL), "--space", str(SPACE), "--workload", str(workload),
        "--trials", "1", "--sampler", "grid", "--mode", "concurrency", "--concurrency", "2",
        *tuner_args(tmp_path / "settings", {
            "confirm": 0, "warm_start": 0, "load": {"max_requests": 4},
            "engine": {"vllm_executable": str(VLLM_EXECUTABLE), "startup_timeout_s": 240},
        }),
        "--storage", f"sqlite:///{db}", "--study", "keyed",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, timeout=560)
    (run_dir / "autotune.out").write_bytes(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    study = optuna.load_study(study_name="keyed", storage=f"sqlite:///{db}")
    (trial,) = study.get_trials(states=(TrialState.COMPLETE,))
    assert trial.user_attrs["outcome"] == "ok"  # the key was sent: vLLM answers 401 without
    assert list(run_dir.glob("**/server.log"))
    assert files_holding(run_dir, SECRET) == []
