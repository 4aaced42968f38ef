"""The study loop: trials until ``--trials`` are counted or time is up, the baseline
first, the tuner's seeds and confirmations inside the budget, workers joining; a run
whose first launches all fail the same way stops there (``verdict.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial

from autotune.redaction import redact_json
from autotune.study.budget import RetryStaleTrial, TrialBudget
from autotune.study.create import check_resumable, create_or_resume
from autotune.study.runner import TrialRunner
from autotune.study.spec import StudyObserver, StudySpec
from autotune.study.storage import open_storage, storage_write_errors
from autotune.study.verdict import VERDICT_ATTR, SameFailureWatch
from autotune.trial.record import TrialRecord, outcome_text
from autotune.tuner.guide import PredictionCache
from autotune.tuner.prediction_cache import CachedPredictions, default_cache_path, read_stored
from autotune.tuner.reach import out_of_reach
from autotune.tuner.session import Tuner


def run_study(spec: StudySpec, *, observer: StudyObserver | None = None) -> optuna.Study:
    """Run trials until ``n_trials`` are COMPLETE or PRUNED (resume counts earlier ones) or
    time is up: exactly ``n_trials``, over every worker (``budget.py``).

    Raises KeyboardInterrupt after recording the running trial as interrupted.
    """
    # Trial failures are recorded in attrs and shown by the observer, not logged.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(
        spec.storage_url,
        heartbeat_interval_s=spec.heartbeat_interval_s,
        on_stale_trial=RetryStaleTrial(spec.n_trials),
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
    deadline = None if spec.timeout_s is None else time.monotonic() + spec.timeout_s
    budget = TrialBudget(
        study,
        storage,
        spec.n_trials,
        deadline=deadline,
        say=observer.on_phase if observer else None,
    )
    if spec.join:
        return _join(spec, study, engine_version, observer, tuner, budget)
    if spec.run_options is not None:  # the latest run's options: what workers join with
        study.set_user_attr("run_options", redact_json(spec.run_options))
    if study.user_attrs.get(VERDICT_ATTR):  # an earlier run's: this one judges afresh
        study.set_user_attr(VERDICT_ATTR, None)
    if spec.sampler != "grid":  # GridSampler ignores enqueued points; it meets the baseline
        baseline = spec.space.baseline_params(engine_version)
        study.enqueue_trial(
            baseline, user_attrs=TrialRecord(is_baseline=True).attrs(), skip_if_exists=True
        )
    with storage_write_errors(spec.storage_url):
        counted = budget.settle().counted  # a killed run's trials first, whatever the count
    tuner.describe_warm_start(study)  # this run's: a resume says what it predicted
    remaining = None if spec.n_trials is None else spec.n_trials - counted
    if remaining is not None and remaining <= 0:
        return study
    if spec.workers is not None:
        spec.workers()
        with storage_write_errors(spec.storage_url):
            budget.settle()  # a worker killed at the end leaves its trial RUNNING
    runner = TrialRunner(spec, study, engine_version, observer, tuner, budget=budget)
    watch = SameFailureWatch(study)
    callbacks = [runner.between_trials.trial_ended, watch, *_observer_callbacks(observer)]
    # FAIL trials (our own errors) do not count towards n_trials, but a run of
    # them must not loop forever: attempts are capped.
    max_attempts = None if remaining is None else 2 * remaining + 5
    with storage_write_errors(spec.storage_url), runner.between_trials.holding():
        if spec.workers is None:
            _optimize(
                study, runner, budget, callbacks, n_trials=max_attempts, timeout_s=spec.timeout_s
            )
        timed = spec.n_trials is None and watch.verdict is None
        if timed and tuner.confirm_slots:  # a timed run: re-measure after it
            tuner.closing = True
            _optimize(study, runner, budget, callbacks, n_trials=tuner.confirm_slots)
        tuner.store_crown(study)
    return study


def _optimize(
    study: optuna.Study,
    runner: TrialRunner,
    budget: TrialBudget,
    callbacks: list[Callable[[optuna.Study, FrozenTrial], None]],
    *,
    n_trials: int | None,
    timeout_s: float | None = None,
) -> None:
    """``study.optimize`` with the budget's gate before each trial (the last callback); a
    storage that failed during a trial ends it with ``StorageStopped``."""
    try:
        if budget.next_slot():
            study.optimize(
                runner,
                n_trials=n_trials,
                timeout=timeout_s,
                callbacks=[*callbacks, budget.after_trial],
                catch=(Exception,),
            )
    finally:
        budget.release()


def _observer_callbacks(observer: StudyObserver | None) -> list[Callable[..., None]]:
    """Report each trial's end."""
    if observer is None:
        return []
    return [lambda study, trial: observer.on_trial_end(trial, trial_outcome(trial), study)]


def _join(
    spec: StudySpec,
    study: optuna.Study,
    engine_version: str,
    observer: StudyObserver | None,
    tuner: Tuner,
    budget: TrialBudget,
) -> optuna.Study:
    """A worker's share: trials until the study has ``n_trials`` counted ones (over every
    worker); the process that set the study up seeds and confirms it."""
    with storage_write_errors(spec.storage_url):
        counted = budget.settle().counted
    remaining = None if spec.n_trials is None else spec.n_trials - counted
    if remaining is not None and remaining <= 0:
        return study
    runner = TrialRunner(spec, study, engine_version, observer, tuner, budget=budget)
    callbacks = [
        runner.between_trials.trial_ended,
        SameFailureWatch(study),
        *_observer_callbacks(observer),
    ]
    with storage_write_errors(spec.storage_url), runner.between_trials.holding():
        _optimize(
            study,
            runner,
            budget,
            callbacks,
            n_trials=None if remaining is None else 2 * remaining + 5,
            timeout_s=spec.timeout_s,
        )
    return study


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
