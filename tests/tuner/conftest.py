"""Shared setup of the tuner tests that need `autotune run`'s own study spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.study import StudySpec
from autotune.study.setup import RunOptions, prepare_study
from autotune.tuner.session import Tuner
from autotune.tuner.settings import TunerSettings
from autotune.workload.gen import ClaudeCodeParams, claudecode
from autotune.workload.io import write_workload

DATA = Path(__file__).resolve().parents[1] / "e2e" / "data"


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> tuple[StudySpec, dict]:
    """`autotune run`'s own setup on an RTX 4090 24 GB with Claude Code traffic up to 60k
    context (test_refine, test_local_search); the predictions cache is shared by a module's
    tests (each config is predicted once)."""
    workload = tmp_path_factory.mktemp("longctx") / "cc-long.jsonl"
    params = ClaudeCodeParams(sessions=4, seed=1, max_context=60_000)
    write_workload(workload, claudecode(params).records())
    spec = prepare_study(
        RunOptions(
            workload=workload,
            engine="sim",
            model="qwen3.6-27b-awq",
            hardware="rtx4090-24g",
            space=DATA / "refine-longctx.yaml",
            storage="sqlite:///:memory:",
        )
    )
    return spec, {}


def guided_tuner(spec: StudySpec, cache: dict, settings: TunerSettings, n_trials: int) -> Tuner:
    """The tuner `autotune run` builds for ``spec`` (guided, maximising throughput)."""
    return Tuner(
        settings,
        space=spec.space,
        model=spec.model,
        engine_version=None,
        prescreen=spec.prescreen,
        oracle=spec.oracle,
        maximize=True,
        guided=True,
        n_trials=n_trials,
        cache=cache,
    )
