"""One trial as Optuna's objective: suggest, derive, launch (or answer a duplicate),
score, record; the trial's attrs, constraints and artifacts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.trial import TrialState

from autotune.config.trial_config import TrialConfig
from autotune.errors import root_cause_text
from autotune.redaction import redact_file
from autotune.replay.load_policy import Progress
from autotune.replay.stats import records_frame
from autotune.study.between_trials import BetweenTrials
from autotune.study.budget import TrialBudget
from autotune.study.spec import StudyObserver, StudySpec, prunes, slug
from autotune.study.storage import STORAGE_FAILURES, StorageStopped, is_storage_failure
from autotune.trial.objective import Goal, Score, request_slo, score
from autotune.trial.pruning import PruneJudge
from autotune.trial.record import TrialRecord
from autotune.trial.run import TrialResult, derive_config, run_trial
from autotune.tuner.lattice import config_key
from autotune.tuner.session import Tuner
from autotune.vocabulary import Outcome


class TrialRunner:
    """The Optuna objective: one call = one trial."""

    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        engine_version: str,
        observer: StudyObserver | None,
        tuner: Tuner,
        *,
        budget: TrialBudget | None = None,
    ) -> None:
        self.spec = spec
        self.tuner = tuner
        self.study = study
        self.engine_version = engine_version
        self.observer = observer
        self.budget = budget
        self.artifacts = FileSystemArtifactStore(str(_ensure_dir(spec.artifacts_dir)))
        self.baseline = spec.space.baseline_params(engine_version)
        self.between_trials = BetweenTrials()
        if budget is not None:  # an interrupt held while it waits for other workers
            budget.interrupted = self.between_trials.raise_pending
            budget.nothing_to_propose = lambda: tuner.nothing_to_propose(study)
        tuner.rebuild(study, lambda params: config_key(self._config(params)))

    def _baseline_seen(self) -> bool:
        trials = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return any(TrialRecord.read(t.user_attrs).is_baseline for t in trials)

    def _enqueued_params(self, number: int) -> dict[str, Any]:
        """The config an enqueued trial was to run (interrupted before it suggested any)."""
        stored = self.study.get_trials(deepcopy=False)[number]
        return dict(stored.system_attrs.get("fixed_params", {}))

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        spec = self.spec
        enqueued = TrialRecord.read(trial.user_attrs)  # is_baseline / retry_of, if enqueued
        try:
            self._claim(trial)
            self.between_trials.trial_started()  # an interrupt held since the last trial
            role = self.tuner.role_of(trial.number)  # a warm-start seed or a re-measurement
            if role is not None:
                TrialRecord(**role.attrs()).write(trial)
            params = spec.space.suggest(trial, self.engine_version)
            is_baseline = enqueued.is_baseline or (
                params == self.baseline and not self._baseline_seen()
            )
            config = self._config(params)
            if self.observer is not None:  # the launched flags: derived values marked
                self.observer.on_trial_start(trial.number, params, config.flags, is_baseline)
            key = config_key(config)
            twin = self.tuner.twin(key, role, trial)
            if twin is not None:
                return self._repeat(trial, twin)
            result = self._run(trial, params, config, prunable=not is_baseline)
        except Exception as exc:  # the claim or a pruning report may meet a full storage
            self._own_error(trial, exc)
            raise
        except KeyboardInterrupt:
            TrialRecord(outcome=Outcome.INTERRUPTED).write(trial)
            params_to_retry = trial.params or self._enqueued_params(trial.number)
            if params_to_retry:
                retry = TrialRecord(is_baseline=enqueued.is_baseline, retry_of=trial.number)
                self.study.enqueue_trial(params_to_retry, user_attrs=retry.attrs())
            raise
        try:
            values = self._finish(trial, result, is_baseline, enqueued.retry_of)
            listed = values if isinstance(values, list) else [values]
            self.tuner.record(
                trial, key, listed if trial.user_attrs.get("measured") else None, trial.constraints
            )
            self.tuner.store_crown(self.study)  # what the live display and `show` quote now
        except Exception as exc:  # it ran, but storing what it measured failed
            self._own_error(trial, exc)
            raise
        if result.outcome_override == Outcome.PRUNED:
            raise optuna.TrialPruned(result.stats.stopped_early if result.stats else None)
        return values

    def _claim(self, trial: optuna.Trial) -> None:
        """The trial's first act: the budget's claim (a heartbeat, its lock let go), then who
        runs it; a RUNNING trial that names no worker never got this far."""
        if self.budget is not None:
            self.budget.claim(trial)
        TrialRecord(worker=worker_name()).write(trial)

    def _own_error(self, trial: optuna.Trial, exc: Exception) -> None:
        """Our own failure, not the server's: the trial's outcome says why (over an ``ok``
        already written) and it ends FAIL, which samplers forget; a full storage stops the
        run instead."""
        if is_storage_failure(exc):
            self._storage_failed(trial, exc)
        error = f"{type(exc).__name__}: {exc}"[:2000]
        try:
            TrialRecord(outcome=Outcome.OWN_ERROR, error=error).write(trial)
        except STORAGE_FAILURES as storing:
            self._storage_failed(trial, storing)

    def _storage_failed(self, trial: optuna.Trial, exc: BaseException) -> NoReturn:
        """The storage stopped taking writes during the trial: store the trial as the
        storage failure it was (FAIL, outcome storage-error) as far as the storage still
        takes a short write, show its end, and stop the study (``StorageStopped``)."""
        error = f"storing the trial failed: {root_cause_text(exc)}"  # short: fewer bytes fit
        with contextlib.suppress(*STORAGE_FAILURES):
            TrialRecord(outcome=Outcome.STORAGE_ERROR, error=error).write(trial)
        with contextlib.suppress(*STORAGE_FAILURES):
            self.study.tell(trial, state=TrialState.FAIL)
        if self.observer is not None:
            ended = self.study.get_trials(deepcopy=False)[trial.number]
            self.observer.on_trial_end(ended, Outcome.STORAGE_ERROR.value, self.study)
        raise StorageStopped(exc) from exc

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
        log_path = spec.runs_dir / slug(spec.name) / f"trial-{trial.number:04d}" / "server.log"
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
                redact_file(path)  # a server's error text may quote a header
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
            replay_timeout_s=spec.replay_timeout_s,
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


def worker_name() -> str:
    """Which worker runs a trial: host, process and GPU group (workers share a study)."""
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"{socket.gethostname()}:{os.getpid()}" + (f" gpus {gpus}" if gpus else "")


def _no_data_latency(spec: StudySpec) -> float:
    return spec.trial_timeout_s or spec.load.request_timeout_s


def _ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
