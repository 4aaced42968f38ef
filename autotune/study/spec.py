"""What `autotune run` decided before the first trial, and the names derived from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial

from autotune.config.space import SearchSpace
from autotune.config.trial_config import TrialConfig
from autotune.defaults import (
    DEFAULT_ARTIFACTS_DIR,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_RUNS_DIR,
    DEFAULT_SAMPLER,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_TRIALS,
)
from autotune.engines.base import BaseEngine
from autotune.replay.load import LoadSpec
from autotune.replay.load_policy import Progress
from autotune.replay.records import RequestRecord
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.trial.objective import Goal, ObjectiveName
from autotune.trial.run import Prescreen, TrialResult
from autotune.tuner.guide import PredictionCache
from autotune.tuner.predictor import SimOracle
from autotune.tuner.settings import TunerSettings
from autotune.workload.plan import WorkloadPlan

SAMPLERS = ("guided", "gp", "tpe", "random", "grid")


class StudyObserver(Protocol):
    """Progress hooks; the CLI's rich display implements them."""

    def on_trial_start(
        self, number: int, params: dict[str, Any], flags: dict[str, Any], is_baseline: bool
    ) -> None: ...

    def on_phase(self, phase: str) -> None: ...

    def on_request_done(self, record: RequestRecord, done: int, total: int | None) -> None: ...

    def on_trial_end(self, trial: FrozenTrial, outcome: str, study: optuna.Study) -> None: ...


@dataclass
class StudySpec:
    """Everything `autotune run` decided before the first trial."""

    name: str
    storage_url: str
    space: SearchSpace
    space_path: Path
    goal: Goal
    model: str
    engine: BaseEngine
    plan: WorkloadPlan
    workload_path: Path
    load: LoadSpec
    n_trials: int | None = DEFAULT_TRIALS
    timeout_s: float | None = None
    trial_timeout_s: float | None = None  # a trial's whole limit, start included
    replay_timeout_s: float | None = None  # its limit once the server is ready (the default)
    replay_wall_s: float | None = None  # one trial's predicted replay (wall s): the ETA's
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    sampler: str | optuna.samplers.BaseSampler = DEFAULT_SAMPLER  # a name, or a sampler to use
    seed: int | None = None
    prescreen: Prescreen | None = None  # the memory model's estimate of a config
    skip_predicted_oom: bool = True  # score what the estimate rejects without launching
    artifacts_dir: Path = DEFAULT_ARTIFACTS_DIR
    runs_dir: Path = DEFAULT_RUNS_DIR
    heartbeat_interval_s: int = DEFAULT_HEARTBEAT_S
    token_note: str | None = None  # why the plan is not token-exact for the served model
    tuner: TunerSettings = field(default_factory=TunerSettings)
    oracle: SimOracle | None = None  # the simulator's prediction of any config (warm start)
    prediction_cache: PredictionCache | None = None
    calibration: CalibrationProfile | None = None  # the simulator's speed constants, if given
    # How a config is measured; None: launch the engine (benchmarks answer in-process).
    # Its last argument, when not None, sees the replay's progress and may stop it.
    measure: (
        Callable[[StudySpec, TrialConfig, Path, Callable[[Progress], bool] | None], TrialResult]
        | None
    ) = None
    run_options: dict[str, Any] | None = None  # stored, so `autotune worker` can join
    join: bool = False  # a worker of a study another process set up: no seeds, no confirmation
    # Runs the search in other processes (`run --gpus`), returning when they are done.
    workers: Callable[[], None] | None = None


def prunes(spec: StudySpec) -> bool:
    """Pruning is on and the study maximizes output throughput alone (what the replay
    reports as it goes)."""
    return spec.tuner.prune and spec.goal.objectives == [ObjectiveName.THROUGHPUT]


def run_log_path(spec: StudySpec) -> Path:
    """The study's log file, beside its trials' server logs."""
    return spec.runs_dir / slug(spec.name) / "run.log"


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in name)


def default_study_name(model: str, gpu: str, workload: str, objectives: list[str]) -> str:
    """``<model>@<gpu>/<workload>/<objective>``."""
    return f"{Path(model).name}@{gpu}/{workload}/{','.join(objectives)}"
