"""The study loop: trials until ``--trials`` are counted or time is up, the baseline
first, the tuner's seeds and confirmations inside the budget, workers joining; a run
whose first launches all fail the same way stops there (``verdict.py``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.redaction import redact_json
from autotune.study.create import check_resumable, create_or_resume
from autotune.study.runner import TrialRunner
from autotune.study.spec import StudyObserver, StudySpec
from autotune.study.storage import (
    COUNTED_STATES,
    completed_count,
    open_storage,
    storage_write_errors,
)
from autotune.study.verdict import VERDICT_ATTR, SameFailureWatch
from autotune.trial.record import TrialRecord, outcome_text
from autotune.tuner.guide import PredictionCache
from autotune.tuner.prediction_cache import CachedPredictions, default_cache_path, read_stored
from autotune.tuner.reach import out_of_reach
from autotune.tuner.session import Tuner


def run_study(spec: StudySpec, *, observer: StudyObserver | None = None) -> optuna.Study:
    """Run trials until ``n_trials`` are COMPLETE or PRUNED (resume counts earlier ones) or
    time is up.

    Raises KeyboardInterrupt after recording the running trial as interrupted.
    """
    # Trial failures are recorded in attrs and shown by the observer, not logged.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(
        spec.storage_url,
        heartbeat_interval_s=spec.heartbeat_interval_s,
        on_stale_trial=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
    )
    engine_version = spec.engine.version()
    check_resumable(spec, storage, engine_version)
    cache = open_prediction_cache(spec, storage)
    try:
        return _run_study(spec, storage, engine_version, cache, observer)
    finally:
        if isinstance(cache, CachedPredictions):
            cache.close()


def _run_study(
    spec: StudySpec,
    storage: optuna.storages.BaseStorage,
    engine_version: str,
    cache: PredictionCache | None,
    observer: StudyObserver | None,
) -> optuna.Study:
    say = observer.on_phase if observer else None
    tuner = make_tuner(spec, engine_version, cache=cache, say=say)
    if isinstance(cache, CachedPredictions):
        cache.flush()
    if observer is not None and tuner.describe():
        observer.on_phase(tuner.describe() or "")
        if isinstance(cache, CachedPredictions) and cache.problem:
            observer.on_phase(cache.problem)
        unmet = out_of_reach(tuner.guide, spec.goal) if tuner.guide is not None else None
        if unmet:
            observer.on_phase(unmet)
    study = create_or_resume(spec, storage, engine_version, tuner)
    if isinstance(cache, CachedPredictions) and tuner.guide is not None and not spec.join:
        # Before any worker starts: they, and a resume, read the warm start from here.
        cache.store(study, [candidate.key for candidate in tuner.guide.candidates])
    if spec.join:
        return _join(spec, study, engine_version, observer, tuner)
    if spec.run_options is not None:  # the latest run's options: what workers join with
        study.set_user_attr("run_options", redact_json(spec.run_options))
    if study.user_attrs.get(VERDICT_ATTR):  # an earlier run's: this one judges afresh
        study.set_user_attr(VERDICT_ATTR, None)
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
    if spec.workers is not None:
        spec.workers()
        with warnings.catch_warnings():  # a worker killed at the end leaves its trial RUNNING
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    runner = TrialRunner(spec, study, engine_version, observer, tuner)
    watch = SameFailureWatch(study)
    callbacks = [runner.between_trials.trial_ended, watch, *_callbacks(spec, observer)]
    # FAIL trials (our own errors) do not count towards n_trials, but a run of
    # them must not loop forever: attempts are capped.
    max_attempts = None if remaining is None else 2 * remaining + 5
    with storage_write_errors(spec.storage_url), runner.between_trials.holding():
        if spec.workers is None:
            study.optimize(
                runner,
                n_trials=max_attempts,
                timeout=spec.timeout_s,
                callbacks=callbacks,
                catch=(Exception,),
            )
        timed = spec.n_trials is None and watch.verdict is None
        if timed and tuner.confirm_slots:  # a timed run: re-measure after it
            tuner.closing = True
            study.optimize(
                runner, n_trials=tuner.confirm_slots, callbacks=callbacks, catch=(Exception,)
            )
        tuner.store_crown(study)
    return study


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
    under_way = (*COUNTED_STATES, TrialState.RUNNING)  # a late joiner counts running ones
    under = len(study.get_trials(deepcopy=False, states=under_way))
    remaining = None if spec.n_trials is None else spec.n_trials - under
    if remaining is not None and remaining <= 0:
        return study
    runner = TrialRunner(spec, study, engine_version, observer, tuner)
    callbacks = _callbacks(spec, observer)
    if spec.n_trials:  # this worker's share, not Optuna's count of finished trials
        callbacks = [_stop_at_budget(spec.n_trials), *callbacks[1:]]
    with runner.between_trials.holding():
        study.optimize(
            runner,
            n_trials=None if remaining is None else 2 * remaining + 5,
            timeout=spec.timeout_s,
            callbacks=[runner.between_trials.trial_ended, SameFailureWatch(study), *callbacks],
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


def open_prediction_cache(
    spec: StudySpec, storage: optuna.storages.BaseStorage
) -> PredictionCache | None:
    """The run's prediction cache: the spec's own (a benchmark's), else, when the guided
    sampler predicts (one objective, a simulator to predict by), what the study stores
    and the disk cache (``tuner.prediction_cache``)."""
    predicts = spec.sampler == "guided" and len(spec.goal.objectives) == 1
    if spec.prediction_cache is not None or spec.oracle is None or not predicts:
        return spec.prediction_cache
    return CachedPredictions(
        spec.oracle,
        disk=default_cache_path(spec.storage_url),
        stored=read_stored(storage, spec.name),
    )


def make_tuner(
    spec: StudySpec,
    engine_version: str,
    *,
    cache: PredictionCache | None = None,
    say: Callable[[str], None] | None = None,
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
        cache=spec.prediction_cache if cache is None else cache,
        say=say,
    )


def trial_outcome(trial: FrozenTrial) -> str:
    """The outcome class of a stored trial (FAIL without one: interrupted or our own error)."""
    return outcome_text(TrialRecord.read(trial.user_attrs).outcome, trial.state.name)
