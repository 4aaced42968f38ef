"""Optuna orchestration: storage, sampler, the baseline, attrs, resume, artifacts.

Each trial: space -> TrialConfig -> ``trial.run_trial`` -> ``objective.score``
-> values + constraints + attrs. What a study and its trials store is
specified in docs/architecture.md ("What a study stores").
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import socket
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import optuna
import sqlalchemy.exc
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.trial import FrozenTrial, TrialState

from autotune import __version__
from autotune.defaults import (
    DEFAULT_ARTIFACTS_DIR,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_RUNS_DIR,
    DEFAULT_SAMPLER,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_TRIALS,
)
from autotune.engines.base import BaseEngine
from autotune.errors import InputError, StorageError, StudyMismatchError
from autotune.objective import Goal, ObjectiveName, Score, request_slo, score
from autotune.pruning import BelowBestPruner, PruneJudge
from autotune.replay.load import LoadSpec
from autotune.replay.load_policy import Progress
from autotune.replay.records import RequestRecord
from autotune.replay.stats import records_frame
from autotune.sim.calibration import CalibrationProfile
from autotune.space import SearchSpace
from autotune.trial import Prescreen, TrialResult, derive_config, run_trial
from autotune.trial_config import TrialConfig
from autotune.trial_record import TrialRecord, outcome_text
from autotune.tuner.guide import PredictionCache
from autotune.tuner.lattice import config_key
from autotune.tuner.predictor import SimOracle
from autotune.tuner.session import Tuner, TunerSettings
from autotune.vocabulary import Outcome
from autotune.workload.plan import WorkloadPlan

SAMPLERS = ("guided", "gp", "tpe", "random", "grid")

IDENTITY_ATTRS = ("space_digest", "workload_digest", "objectives", "engine", "model")
# Trials that spent a launch of the --trials budget: measured, failed, or pruned early.
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED)


class StudyObserver(Protocol):
    """Progress hooks; the CLI's rich display implements them."""

    def on_trial_start(self, number: int, params: dict[str, Any], is_baseline: bool) -> None: ...

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
    trial_timeout_s: float | None = None
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


def storage_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 (the ``postgres`` extra), not SQLAlchemy's psycopg2."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url


def open_storage(
    url: str, *, heartbeat_interval_s: int | None = None
) -> optuna.storages.RDBStorage:
    """An RDBStorage for ``url`` with heartbeat and stale-trial retry; errors name the URL."""
    url = storage_url(url)
    try:
        if url.startswith("sqlite:///"):
            path = Path(url.removeprefix("sqlite:///"))
            if str(path) not in ("", ":memory:"):
                path.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            heartbeat: dict[str, Any] = {}
            if heartbeat_interval_s:
                heartbeat = {
                    "heartbeat_interval": heartbeat_interval_s,
                    "grace_period": 3 * heartbeat_interval_s,
                    "heartbeat_stale_trial_callback": (
                        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
                    ),
                }
            return optuna.storages.RDBStorage(
                url, engine_kwargs={"connect_args": _connect_args(url)}, **heartbeat
            )
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError, OSError) as exc:
        raise StorageError(f"--storage {url}: cannot open: {exc}".splitlines()[0]) from exc


def _connect_args(url: str) -> dict[str, Any]:
    return {"timeout": 30} if url.startswith("sqlite") else {}


def make_sampler(
    name: str | optuna.samplers.BaseSampler,
    *,
    seed: int | None,
    space: SearchSpace,
    n_trials: int | None,
    engine_version: str | None,
    tuner: Tuner | None = None,
) -> optuna.samplers.BaseSampler:
    """The simulator-guided sampler by default; GP, TPE, random and grid on request.

    "guided" falls back to TPE when there is no simulator prediction to steer by. A
    sampler instance (a benchmark's strategy) is used as it is. With a ``tuner``, the
    sampler is wrapped so that the tuner chooses seeds and re-measurements.
    """
    base = _base_sampler(
        name, seed=seed, space=space, n_trials=n_trials, engine_version=engine_version, tuner=tuner
    )
    return tuner.wrap(base) if tuner is not None else base


def _base_sampler(
    name: str | optuna.samplers.BaseSampler,
    *,
    seed: int | None,
    space: SearchSpace,
    n_trials: int | None,
    engine_version: str | None,
    tuner: Tuner | None,
) -> optuna.samplers.BaseSampler:
    if isinstance(name, optuna.samplers.BaseSampler):
        return name
    startup = min(10, max(4, (n_trials or 30) // 3))
    if name == "guided" and tuner is not None and tuner.sampler is not None:
        return tuner.sampler
    if name == "guided":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
    if name == "gp":
        if importlib.util.find_spec("torch") is None:
            raise InputError(
                "--sampler gp needs torch, which the default install leaves out: "
                "pip install -e '.[gp]' (or use the default sampler, guided)"
            )
        return optuna.samplers.GPSampler(
            seed=seed, n_startup_trials=startup, warn_independent_sampling=False
        )
    if name == "tpe":  # the constant liar: several workers do not pick the same point at once
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(space.grid(engine_version), seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


def study_attrs(spec: StudySpec, engine_version: str) -> dict[str, Any]:
    """The study-level attrs (docs/architecture.md); the identity ones are checked on resume."""
    return {
        "autotune_version": __version__,
        "engine": spec.engine.name,
        "engine_version": engine_version,
        "hardware": spec.engine.hardware().model_dump(mode="json"),
        "model": spec.model,
        "workload": {
            "path": str(spec.workload_path),
            "name": spec.plan.name,
            "digest": spec.plan.digest,
            "requests": len(spec.plan.requests),
            "sessions": len(spec.plan.sessions),
            "token_space": spec.plan.token_space,
        },
        "workload_digest": spec.plan.digest,
        "load": spec.load.model_dump(mode="json"),
        "objectives": [name.value for name in spec.goal.objectives],
        "directions": spec.goal.directions,
        "slos": [slo.text for slo in spec.goal.slos],
        "max_error_rate": spec.goal.max_error_rate,
        "space": {
            "name": spec.space.name,
            "digest": spec.space.digest(),
            "path": str(spec.space_path),
        },
        "space_digest": spec.space.digest(),
        "time_scale": getattr(spec.engine, "time_scale", 1.0),
        "calibration": spec.calibration.provenance() if spec.calibration else None,
    }


def create_or_resume(
    spec: StudySpec,
    storage: optuna.storages.BaseStorage,
    engine_version: str,
    tuner: Tuner | None = None,
) -> optuna.Study:
    """Create the study, or load it and refuse to resume with another space/workload/goal."""
    sampler = make_sampler(
        spec.sampler,
        seed=spec.seed,
        space=spec.space,
        n_trials=spec.n_trials,
        engine_version=engine_version,
        tuner=tuner,
    )
    attrs = study_attrs(spec, engine_version)
    pruner = BelowBestPruner() if prunes(spec) else optuna.pruners.NopPruner()
    existing = {summary.study_name: summary for summary in optuna.get_all_study_summaries(storage)}
    if spec.name in existing:
        stored = existing[spec.name].user_attrs
        for key in IDENTITY_ATTRS:
            if key in stored and stored[key] != attrs[key]:
                raise StudyMismatchError(
                    f"study {spec.name!r} was created with another {key.replace('_', ' ')} "
                    f"({stored[key]!r}, now {attrs[key]!r}); use --study NEW_NAME"
                )
        _check_same_calibration(spec.name, stored, attrs["calibration"])
        study = optuna.load_study(
            study_name=spec.name, storage=storage, sampler=sampler, pruner=pruner
        )
        if list(study.directions) != [_direction(d) for d in spec.goal.directions]:
            raise StudyMismatchError(f"study {spec.name!r} has other objective directions")
        return study
    study = optuna.create_study(
        study_name=spec.name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        directions=spec.goal.directions,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(spec.goal.metric_names)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    return study


def _check_same_calibration(name: str, stored: dict[str, Any], used: dict[str, Any] | None) -> None:
    """StudyMismatchError when the study's trials were predicted with another profile."""
    if "calibration" not in stored:  # a study older than the attr
        return
    before = stored["calibration"]
    if (before or {}).get("digest") == (used or {}).get("digest"):
        return
    raise StudyMismatchError(
        f"study {name!r} was run with {_profile_words(before)}, now {_profile_words(used)}; "
        "resume with the same --calibration, or use --study NEW_NAME"
    )


def _profile_words(provenance: dict[str, Any] | None) -> str:
    if provenance is None:
        return "no calibration profile"
    where = provenance.get("path") or provenance.get("source") or "a profile"
    return f"calibration profile {where} (digest {provenance.get('digest')})"


def _direction(name: str) -> optuna.study.StudyDirection:
    return optuna.study.StudyDirection[name.upper()]


def prunes(spec: StudySpec) -> bool:
    """Pruning is on and the study maximizes output throughput alone (what the replay
    reports as it goes)."""
    return spec.tuner.prune and spec.goal.objectives == [ObjectiveName.THROUGHPUT]


def completed_count(study: optuna.Study) -> int:
    """Finished trials that count towards ``--trials``: COMPLETE and PRUNED."""
    return len(study.get_trials(deepcopy=False, states=COUNTED_STATES))


def completed_trials(spec: StudySpec) -> int | None:
    """COMPLETE trials of the study ``spec`` names, or None when it does not exist yet."""
    storage = open_storage(spec.storage_url)
    if spec.name not in optuna.get_all_study_names(storage):
        return None
    return completed_count(optuna.load_study(study_name=spec.name, storage=storage))


def run_study(spec: StudySpec, *, observer: StudyObserver | None = None) -> optuna.Study:
    """Run trials until ``n_trials`` are COMPLETE or PRUNED (resume counts earlier ones) or
    time is up.

    Raises KeyboardInterrupt after recording the running trial as interrupted.
    """
    # Trial failures are recorded in attrs and shown by the observer, not logged.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(spec.storage_url, heartbeat_interval_s=spec.heartbeat_interval_s)
    engine_version = spec.engine.version()
    tuner = make_tuner(spec, engine_version, say=observer.on_phase if observer else None)
    if observer is not None and tuner.describe():
        observer.on_phase(tuner.describe() or "")
    study = create_or_resume(spec, storage, engine_version, tuner)
    if spec.join:
        return _join(spec, study, engine_version, observer, tuner)
    if spec.run_options is not None:  # the latest run's options: what workers join with
        study.set_user_attr("run_options", spec.run_options)
    if spec.sampler != "grid":  # GridSampler ignores enqueued points; it meets the baseline
        baseline = spec.space.baseline_params(engine_version)
        study.enqueue_trial(
            baseline, user_attrs=TrialRecord(is_baseline=True).attrs(), skip_if_exists=True
        )
    if completed_count(study) == 0:
        tuner.describe_warm_start(study)

    remaining = None if spec.n_trials is None else spec.n_trials - completed_count(study)
    if remaining is not None and remaining <= 0:
        return study
    callbacks = _callbacks(spec, observer)
    if spec.workers is not None:
        spec.workers()
        with warnings.catch_warnings():  # a worker killed at the end leaves its trial RUNNING
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    runner = _TrialRunner(spec, study, engine_version, observer, tuner)
    # FAIL trials (our own errors) do not count towards n_trials, but a run of
    # them must not loop forever: attempts are capped.
    max_attempts = None if remaining is None else 2 * remaining + 5
    with _storage_write_errors(spec.storage_url):
        if spec.workers is None:
            study.optimize(
                runner,
                n_trials=max_attempts,
                timeout=spec.timeout_s,
                callbacks=callbacks,
                catch=(Exception,),
            )
        if spec.n_trials is None and tuner.confirm_slots:  # a timed run: re-measure after it
            tuner.closing = True
            study.optimize(
                runner, n_trials=tuner.confirm_slots, callbacks=callbacks, catch=(Exception,)
            )
        tuner.finish(study)
    return study


@contextlib.contextmanager
def _storage_write_errors(url: str) -> Iterator[None]:
    """A storage that stops taking writes (disk full, read-only, locked) mid-study: one line.

    Each trial is its own transaction, so what was stored before stays whole; the
    trial that was running is recovered as stale on the next run.
    """
    try:
        yield
    except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as exc:
        root: BaseException = exc
        while root.__cause__ is not None:
            root = root.__cause__
        cause = (str(root).splitlines() or [type(root).__name__])[0]
        raise StorageError(
            f"--storage {url}: writing the study failed: {cause}. The trials stored before are "
            "intact; make room (or fix permissions, or stop the other writer) and rerun the "
            "same command to resume"
        ) from exc


def _callbacks(spec: StudySpec, observer: StudyObserver | None) -> list[Callable[..., None]]:
    """Stop at ``n_trials`` counted trials; report each trial's end."""
    callbacks = []
    if spec.n_trials is not None:
        callbacks.append(optuna.study.MaxTrialsCallback(spec.n_trials, states=COUNTED_STATES))
    if observer is not None:
        callbacks.append(
            lambda study, trial: observer.on_trial_end(trial, trial_outcome(trial), study)
        )
    return callbacks


def _join(
    spec: StudySpec,
    study: optuna.Study,
    engine_version: str,
    observer: StudyObserver | None,
    tuner: Tuner,
) -> optuna.Study:
    """A worker's share: trials until the study has ``n_trials`` counted ones (over every
    worker); the process that set the study up seeds and confirms it."""
    callbacks = _callbacks(spec, observer)
    under_way = (*COUNTED_STATES, TrialState.RUNNING)  # a late joiner counts running ones
    under = len(study.get_trials(deepcopy=False, states=under_way))
    remaining = None if spec.n_trials is None else spec.n_trials - under
    if remaining is not None and remaining <= 0:
        return study
    runner = _TrialRunner(spec, study, engine_version, observer, tuner)
    study.optimize(
        runner,
        n_trials=None if remaining is None else 2 * remaining + 5,
        timeout=spec.timeout_s,
        callbacks=[_stop_at_budget(spec.n_trials), *callbacks[1:]] if spec.n_trials else callbacks,
        catch=(Exception,),
    )
    return study


def _stop_at_budget(n_trials: int) -> Callable[[optuna.Study, FrozenTrial], None]:
    """Stop once counted trials plus those other workers are running reach ``n_trials``:
    Optuna's MaxTrialsCallback counts finished ones only, so each worker but the last
    would start one trial too many."""

    def stop(study: optuna.Study, trial: FrozenTrial) -> None:
        with warnings.catch_warnings():  # a dead worker's trial is not running any more
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        states = (*COUNTED_STATES, TrialState.RUNNING)
        if len(study.get_trials(deepcopy=False, states=states)) >= n_trials:
            study.stop()

    return stop


def make_tuner(
    spec: StudySpec, engine_version: str, *, say: Callable[[str], None] | None = None
) -> Tuner:
    """The tuner of this run; it predicts the whole space when the sampler is guided."""
    return Tuner(
        spec.tuner,
        space=spec.space,
        model=spec.model,
        engine_version=engine_version,
        prescreen=spec.prescreen,
        oracle=spec.oracle if len(spec.goal.objectives) == 1 else None,
        maximize=spec.goal.directions[0] == "maximize",
        guided=spec.sampler == "guided",
        n_trials=spec.n_trials,
        seed=spec.seed,
        cache=spec.prediction_cache,
        say=say,
    )


class _TrialRunner:
    """The Optuna objective: one call = one trial."""

    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        engine_version: str,
        observer: StudyObserver | None,
        tuner: Tuner,
    ) -> None:
        self.spec = spec
        self.tuner = tuner
        self.study = study
        self.engine_version = engine_version
        self.observer = observer
        self.artifacts = FileSystemArtifactStore(str(_ensure_dir(spec.artifacts_dir)))
        self.baseline = spec.space.baseline_params(engine_version)
        tuner.rebuild(study, lambda params: config_key(self._config(params)))

    def _baseline_seen(self) -> bool:
        trials = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return any(TrialRecord.read(t.user_attrs).is_baseline for t in trials)

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        spec = self.spec
        enqueued = TrialRecord.read(trial.user_attrs)  # is_baseline / retry_of, if enqueued
        role = self.tuner.role_of(trial.number)  # a warm-start seed or a re-measurement
        if role is not None:
            TrialRecord(**role.attrs()).write(trial)
        TrialRecord(worker=worker_name()).write(trial)
        try:
            params = spec.space.suggest(trial, self.engine_version)
            is_baseline = enqueued.is_baseline or (
                params == self.baseline and not self._baseline_seen()
            )
            if self.observer is not None:
                self.observer.on_trial_start(trial.number, params, is_baseline)
            config = self._config(params)
            key = config_key(config)
            twin = self.tuner.twin(key, role, trial)
            if twin is not None:
                return self._repeat(trial, twin)
            result = self._run(trial, params, config, prunable=not is_baseline)
        except Exception as exc:
            # Our own failure, not the server's: FAIL with the reason; samplers forget it.
            error = f"{type(exc).__name__}: {exc}"[:2000]
            TrialRecord(outcome=Outcome.OWN_ERROR, error=error).write(trial)
            raise
        except KeyboardInterrupt:
            TrialRecord(outcome=Outcome.INTERRUPTED).write(trial)
            if trial.params:
                retry = TrialRecord(is_baseline=enqueued.is_baseline, retry_of=trial.number)
                self.study.enqueue_trial(trial.params, user_attrs=retry.attrs())
            raise
        values = self._finish(trial, result, is_baseline, enqueued.retry_of)
        listed = values if isinstance(values, list) else [values]
        self.tuner.record(
            trial, key, listed if trial.user_attrs.get("measured") else None, trial.constraints
        )
        if result.outcome_override == Outcome.PRUNED:
            raise optuna.TrialPruned(result.stats.stopped_early if result.stats else None)
        return values

    def _repeat(self, trial: optuna.Trial, twin: Any) -> float | list[float]:
        """No launch: this effective config was measured in trial ``twin.first_trial``."""
        TrialRecord(outcome=Outcome.DUPLICATE, duplicate_of=twin.first_trial).write(trial)
        for key, value in twin.constraints.items():
            trial.set_constraint(key, value)
        values = twin.values if twin.values is not None else self._placeholder()
        return values[0] if len(values) == 1 else values

    def _config(self, params: dict[str, Any]) -> TrialConfig:
        return derive_config(
            self.spec.space,
            params,
            model=self.spec.model,
            engine_version=self.engine_version,
            reported_block_size=self.study.user_attrs.get("attention_block_size"),
            prescreen=self.spec.prescreen,
        )

    def _run(
        self, trial: optuna.Trial, params: dict[str, Any], config: TrialConfig, *, prunable: bool
    ) -> TrialResult:
        spec = self.spec
        violations = spec.space.rule_violations(params)
        if violations:
            return TrialResult(
                config=config,
                outcome_override=Outcome.RULE_VIOLATED.value,
                rule_violations=violations,
            )
        log_path = spec.runs_dir / _slug(spec.name) / f"trial-{trial.number:04d}" / "server.log"
        judge = None
        # Re-measurements run out unjudged; the baseline (the yardstick of every summary)
        # reports its steps but runs out too.
        if prunes(spec) and trial.user_attrs.get("confirms") is None:
            judge = PruneJudge(trial, may_stop=prunable)
        if spec.measure is not None:
            result = spec.measure(spec, config, log_path, judge)
        else:
            result = run_configured_trial(
                spec, config, log_path=log_path, observer=self.observer, on_progress=judge
            )
        if judge is not None and judge.pruned_at is not None:
            result.outcome_override = Outcome.PRUNED.value
        return result

    def _finish(
        self, trial: optuna.Trial, result: TrialResult, is_baseline: bool, retry_of: int | None
    ) -> float | list[float]:
        spec = self.spec
        scored = score_result(spec.goal, result)
        self._record(trial, result, scored, is_baseline, retry_of)
        for key, value in scored.constraints.items():
            trial.set_constraint(key, value)
        values = scored.values if scored.values is not None else self._placeholder()
        return values[0] if len(values) == 1 else values

    def _record(
        self,
        trial: optuna.Trial,
        result: TrialResult,
        scored: Score,
        is_baseline: bool,
        retry_of: int | None,
    ) -> None:
        TrialRecord(
            outcome=scored.outcome,
            is_baseline=is_baseline,
            retry_of=retry_of,
            config=result.config,
            argv=result.argv,
            startup=result.startup,
            replay=result.stats,
            server_stats=result.server_stats,
            failure=result.failure,
            memory=result.memory.report if result.memory else None,
            engine_version=self.engine_version,
            hardware=self.study.user_attrs.get("hardware"),
            wall_s=round(result.wall_s, 3),
            rule_violations=result.rule_violations or None,
        ).write(trial)
        block = result.startup.attention_block_size if result.startup else None
        if block and block != self.study.user_attrs.get("attention_block_size"):
            self.study.set_user_attr("attention_block_size", block)
        self._upload(trial, result)

    def _upload(self, trial: optuna.Trial, result: TrialResult) -> None:
        if result.log_path is not None and result.log_path.exists():
            upload_artifact(
                artifact_store=self.artifacts,
                file_path=str(result.log_path),
                study_or_trial=trial,
                mimetype="text/plain",
            )
        if result.records:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "requests.csv"
                records_frame(result.records).to_csv(path, index=False)
                upload_artifact(
                    artifact_store=self.artifacts,
                    file_path=str(path),
                    study_or_trial=trial,
                    mimetype="text/csv",
                )

    def _placeholder(self) -> list[float]:
        """The worst measured value so far per objective (moderate, never extreme)."""
        directions = self.spec.goal.directions
        measured = [
            t
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if TrialRecord.read(t.user_attrs).measured
        ]
        feasible = [t for t in measured if all(v <= 0 for v in t.constraints.values())]
        pool = feasible or measured
        values = []
        for index, direction in enumerate(directions):
            column = [t.values[index] for t in pool]
            if column:
                values.append(min(column) if direction == "maximize" else max(column))
            else:
                values.append(0.0 if direction == "maximize" else _no_data_latency(self.spec))
        return values


def run_configured_trial(
    spec: StudySpec,
    config: TrialConfig,
    *,
    log_path: Path,
    observer: StudyObserver | None = None,
    on_progress: Callable[[Progress], bool] | None = None,
) -> TrialResult:
    """One trial of ``config`` with the study's engine, workload, load, limits and pre-screen."""
    return asyncio.run(
        run_trial(
            config,
            engine=spec.engine,
            plan=spec.plan,
            load=spec.load,
            log_path=log_path,
            slo=request_slo(spec.goal.slos),
            prescreen=spec.prescreen,
            skip_predicted_oom=spec.skip_predicted_oom,
            startup_timeout_s=spec.startup_timeout_s,
            trial_timeout_s=spec.trial_timeout_s,
            observer=observer,
            on_progress=on_progress,
        )
    )


def score_result(goal: Goal, result: TrialResult) -> Score:
    """Objective values and constraints of a finished trial."""
    return score(
        goal,
        stats=result.stats,
        failure=result.failure,
        memory_margin=result.memory.margin if result.memory is not None else None,
        outcome_override=result.outcome_override,
    )


def trial_outcome(trial: FrozenTrial) -> str:
    """The outcome class of a stored trial (FAIL without one: interrupted or our own error)."""
    return outcome_text(TrialRecord.read(trial.user_attrs).outcome, trial.state.name)


def worker_name() -> str:
    """Which worker runs a trial: host, process and GPU group (workers share a study)."""
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"{socket.gethostname()}:{os.getpid()}" + (f" gpus {gpus}" if gpus else "")


def _no_data_latency(spec: StudySpec) -> float:
    return spec.trial_timeout_s or spec.load.request_timeout_s


def _ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_log_path(spec: StudySpec) -> Path:
    """The study's log file, beside its trials' server logs."""
    return spec.runs_dir / _slug(spec.name) / "run.log"


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in name)


def default_study_name(model: str, gpu: str, workload: str, objectives: list[str]) -> str:
    """``<model>@<gpu>/<workload>/<objective>``."""
    return f"{Path(model).name}@{gpu}/{workload}/{','.join(objectives)}"
