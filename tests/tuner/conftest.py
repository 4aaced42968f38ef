"""Shared setup of the tuner tests that need `autotune run`'s own study spec."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna
import pytest

from autotune.replay.load import LoadSpec
from autotune.study import StudySpec, run_study
from autotune.study.setup import RunOptions, prepare_study
from autotune.tuner.session import Tuner
from autotune.tuner.settings import TunerSettings
from autotune.workload.gen import ClaudeCodeParams, claudecode
from autotune.workload.io import write_workload

DATA = Path(__file__).resolve().parents[1] / "e2e" / "data"
SMALL = DATA / "tuner-small.yaml"
WORKLOAD = Path(__file__).resolve().parents[2] / "workloads" / "sample-claudecode.jsonl"


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> tuple[StudySpec, dict]:
    """`autotune run`'s own setup on an RTX 4090 24 GB with Claude Code traffic up to 60k
    context (test_refine, test_local_search); the predictions cache is shared by a module's
    tests (each config is predicted once)."""
    return longctx_spec(tmp_path_factory, DATA / "refine-longctx.yaml"), {}


def longctx_spec(tmp_path_factory: pytest.TempPathFactory, space: Path) -> StudySpec:
    """`autotune run`'s setup of ``space`` on an RTX 4090 24 GB with Claude Code traffic
    up to 60k context."""
    workload = tmp_path_factory.mktemp("longctx") / "cc-long.jsonl"
    params = ClaudeCodeParams(sessions=4, seed=1, max_context=60_000)
    write_workload(workload, claudecode(params).records())
    return prepare_study(
        RunOptions(
            workload=workload,
            engine="sim",
            model="qwen3.6-27b-awq",
            hardware="rtx4090-24g",
            space=space,
            storage="sqlite:///:memory:",
        )
    )


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


def run_small_study(
    tmp_path: Path, *, measure: object, settings: TunerSettings, trials: int, study: str
) -> optuna.Study:
    """`autotune run`'s own study of the small space (tuner-small.yaml, the sample
    workload, an RTX 4080 Super 32 GB) with ``measure`` in place of a server, stored in
    ``tmp_path``: a second call with the same ``tmp_path`` and ``study`` resumes it."""
    options = RunOptions(
        workload=WORKLOAD, model="qwen3.6-27b-awq", hardware="rtx4080s-32g", space=SMALL,
        storage=f"sqlite:///{tmp_path / 'a.db'}", study=study, trials=trials,
        load=LoadSpec(max_requests=10, concurrency=4), tuner=settings,
    )  # fmt: skip
    spec = dataclasses.replace(
        prepare_study(options),
        measure=measure,
        artifacts_dir=tmp_path / "artifacts",
        runs_dir=tmp_path / "runs",
        heartbeat_interval_s=0,
    )
    return run_study(spec)
