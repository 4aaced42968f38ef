"""The ``--trials`` budget on every path: N counted trials, never more, never fewer.

A trial counts once it ends COMPLETE or PRUNED. Every process that runs trials (a
single `autotune run`, each `autotune worker`) passes ``TrialBudget.next_slot``
before each one:

1. Stale trials first, whatever the count. A RUNNING trial is stale when its
   heartbeat is older than the grace period (its process died: ``kill -9``, the OOM
   killer, a lost host), or when it never named its worker within that time (killed
   between Optuna creating it and its first act). It is failed and, while the budget
   has room, its config is enqueued once more, marked ``retry_of`` (``RetryStaleTrial``).
2. The budget met: stop.
3. The rest of the budget running elsewhere: wait, then decide again. A live
   trial ends and counts, or fails and leaves room; a dead one goes stale and is
   retried. Stopping here instead left a dead worker's last trial RUNNING for good.
4. Nothing left that the guided sampler proposes, outside the tail (the next trial a
   random draw, most often answered at once: a duplicate, a predicted OOM), said once:
   while other trials run, wait for them. Such answers then spent a small space's
   budget before the launches had measured anything the tail could re-measure.
5. Otherwise start one. On PostgreSQL the decision and Optuna's creation of the
   trial happen under an advisory lock per study, so two workers never both take
   the last slot; the trial's first act (``claim``) releases it.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import optuna
import sqlalchemy
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from autotune.study.storage import COUNTED_STATES, GRACE_HEARTBEATS
from autotune.trial.record import TrialRecord

POLL_S = 1.0  # how often a worker waiting for the rest of the budget looks again
WORKER_ATTR = "worker"  # the first attr a trial writes; see TrialRunner's first act


class RetryStaleTrial:
    """Optuna's heartbeat-stale callback: enqueue a dead trial's config once more.

    The retry carries ``retry_of`` (and Optuna's ``failed_trial``), keeps
    ``is_baseline``, and nothing else of the dead trial's attrs. A retry that dies in
    turn is not retried (the config may be what kills the process), a trial that had
    not chosen its config yet leaves nothing to retry, and a study whose budget is
    spent by counted, running and waiting trials gets no retry.
    """

    def __init__(self, n_trials: int | None) -> None:
        self.n_trials = n_trials

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "failed_trial" in trial.system_attrs:
            return
        if not trial.params and not trial.system_attrs.get("fixed_params"):
            return
        trials = study.get_trials(deepcopy=False)
        if any(other.system_attrs.get("failed_trial") == trial.number for other in trials):
            return  # another worker retried it already
        if self.n_trials is not None:
            pending = (*COUNTED_STATES, TrialState.RUNNING, TrialState.WAITING)
            if sum(other.state in pending for other in trials) >= self.n_trials:
                return
        record = TrialRecord.read(trial.user_attrs)
        retry = TrialRecord(is_baseline=record.is_baseline, retry_of=trial.number)
        system_attrs = {
            **trial.system_attrs,
            "failed_trial": trial.number,
            "retry_history": [*trial.system_attrs.get("retry_history", []), trial.number],
        }
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.WAITING,
                params=trial.params,
                distributions=trial.distributions,
                user_attrs=retry.attrs(),
                system_attrs=system_attrs,
            )
        )


@dataclass(frozen=True)
class Standing:
    """The budget after stale trials were dealt with."""

    counted: int
    running: list[FrozenTrial]

    def running_text(self) -> str:
        """``trial 9 (host:pid gpus 1), trial 10 (host:pid)``: what the budget waits for."""
        return ", ".join(
            f"trial {t.number} ({t.user_attrs.get(WORKER_ATTR, 'starting')})" for t in self.running
        )


class TrialBudget:
    """The gate every trial passes (module docstring); ``n_trials`` None: a timed run."""

    def __init__(
        self,
        study: optuna.Study,
        storage: RDBStorage,
        n_trials: int | None,
        *,
        deadline: float | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.study = study
        self.storage = storage
        self.n_trials = n_trials
        self.deadline = deadline  # time.monotonic() after which nothing new starts
        self._say = say or (lambda _: None)
        # Raises KeyboardInterrupt when one is held between trials (the runner sets it).
        self.interrupted: Callable[[], None] = lambda: None
        # True when the guided sampler has nothing left to propose (the runner sets it to
        # the tuner's ``nothing_to_propose``).
        self.nothing_to_propose: Callable[[], bool] = lambda: False
        self._said_empty = False
        self._lock = _StudyLock.for_storage(storage, study.study_name)
        self._retry = RetryStaleTrial(n_trials)

    def settle(self) -> Standing:
        """Fail (and retry) stale trials; what counts and what runs then."""
        with self._lock:
            return self._settle()

    def next_slot(self) -> bool:
        """True: start a trial now (on PostgreSQL the budget's lock is held until its first
        act calls ``claim``). False: the budget is met or time is up; nothing is held."""
        said = False
        while True:
            self._lock.acquire()
            standing = self._settle()
            if self.n_trials is None or standing.counted + len(standing.running) < self.n_trials:
                if not self.nothing_to_propose():
                    return True
                self._say_nothing_to_propose()
                if not standing.running:
                    return True
                self._lock.release()
                self.interrupted()
                time.sleep(POLL_S)
                continue
            self._lock.release()
            if standing.counted >= self.n_trials or self._past_deadline():
                return False
            if not said:
                self._say(
                    f"{standing.counted} of {self.n_trials} trials done, the rest of the budget "
                    f"running: {standing.running_text()}; waiting for it to end (a dead "
                    f"worker's trial is retried once its heartbeat is {self._grace_s():.0f} s old)"
                )
                said = True
            self.interrupted()
            time.sleep(POLL_S)

    def _say_nothing_to_propose(self) -> None:
        """Step 4 of the module docstring, said once."""
        if not self._said_empty:
            self._say(
                "nothing left that the guided sampler proposes (every config measured, being "
                "measured, predicted to OOM or to behave like one measured): until the tail, "
                "trials draw at random from the space, and a config drawn before is answered "
                "without a launch (a duplicate; --trials counts it); none starts while another "
                "trial runs"
            )
            self._said_empty = True

    def after_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """An Optuna callback, the last: stop the study unless another trial may start."""
        if not self.next_slot():
            study.stop()

    def claim(self, trial: optuna.Trial) -> None:
        """The trial's first act: a heartbeat now (so that a trial naming its worker always
        has one to go stale), then the budget's lock goes: the trial is counted as running."""
        try:
            if self.storage.get_heartbeat_interval() is not None:
                self.storage.record_heartbeat(trial._trial_id)
        finally:
            self._lock.release()

    def release(self) -> None:
        """Let go of the lock if a slot was taken and no trial claimed it (the run ended)."""
        self._lock.release()

    def _settle(self) -> Standing:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)  # heartbeats older than the grace
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if WORKER_ATTR not in trial.user_attrs and self._started_long_ago(trial):
                self._fail_and_retry(trial)
        trials = self.study.get_trials(deepcopy=False)
        counted = sum(trial.state in COUNTED_STATES for trial in trials)
        running = [trial for trial in trials if trial.state == TrialState.RUNNING]
        return Standing(counted, running)

    def _fail_and_retry(self, trial: FrozenTrial) -> None:
        """A trial that died before its first act has no heartbeat Optuna could find stale."""
        try:
            failed = self.storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            return  # another worker got there first
        if failed:
            self._retry(self.study, self.storage.get_trial(trial._trial_id))

    def _grace_s(self) -> float:
        interval = self.storage.get_heartbeat_interval()
        return float(GRACE_HEARTBEATS * interval) if interval else float("inf")

    def _started_long_ago(self, trial: FrozenTrial) -> bool:
        started = trial.datetime_start  # the creating host's local time, as Optuna stores it
        grace_s = self._grace_s()
        return started is not None and datetime.now() - started > timedelta(seconds=grace_s)

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


class _StudyLock:
    """Serialises the budget decision and the trial's creation between workers.

    A PostgreSQL session-level advisory lock on its own connection (a worker that dies
    drops it with its connection). SQLite takes one writer, so there is nothing to
    serialise there; other databases get no lock (docs/architecture.md).
    """

    def __init__(self, engine: sqlalchemy.Engine | None, key: int) -> None:
        self._engine = engine
        self._key = key
        self._connection: sqlalchemy.Connection | None = None

    @classmethod
    def for_storage(cls, storage: RDBStorage, study_name: str) -> _StudyLock:
        engine = storage.engine if storage.engine.dialect.name == "postgresql" else None
        digest = hashlib.sha256(f"autotune budget {study_name}".encode()).digest()
        return cls(engine, int.from_bytes(digest[:8], "big", signed=True))

    def acquire(self) -> None:
        if self._engine is None or self._connection is not None:
            return
        connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": self._key})
        self._connection = connection

    def release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            connection.execute(
                sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": self._key}
            )
        finally:
            connection.close()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
