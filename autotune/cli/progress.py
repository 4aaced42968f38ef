"""Progress of a study: trial n/N, phase, best so far, elapsed, ETA.

``PlainProgress`` writes one plain line per phase and per finished trial, for stdout
that is a file or a pipe and for the study's log file (overnight runs are read
afterwards, not watched). ``RichProgress``, on a terminal, prints the same line for
each finished trial and keeps one live status line under them, redrawn four times a
second (the clock runs on through a long warm start). Trials are named by their
number (0 first, as ``show`` and ``export --trial`` name them), with ``[k/N]`` the
count of trials done or running out of the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.live import Live
from rich.text import Text

from autotune.config.trial_config import params_text
from autotune.replay.records import RequestRecord
from autotune.trial.record import TrialRecord
from autotune.tuner.record import TunerStudyRecord

REPLAY_PHASE = "replaying"  # the phase a trial's replay starts with (trial/run.py)


def _mean(values: list[float], default: float) -> float:
    return sum(values) / len(values) if values else default


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass(frozen=True)
class Best:
    """The best so far as the displays quote it: the tuner's crown (the mean of its
    measurements) when there is one, else the best single feasible run."""

    trial: int
    value: float
    runs: int = 1

    def text(self, metric: str) -> str:
        runs = f", mean of {self.runs}" if self.runs > 1 else ""
        return f"best {self.value:,.1f} {metric} (#{self.trial}{runs})"


class Tally:
    """What both displays count: trials done, the best so far, elapsed time and ETA."""

    def __init__(
        self,
        *,
        n_trials: int | None,
        already_done: int,
        maximize: bool,
        best: Best | None = None,
        replay_wall_s: float | None = None,
    ) -> None:
        self.n_trials = n_trials
        self.replay_wall_s = replay_wall_s  # one trial's predicted replay (None: unknown)
        self.trial_at: float | None = None  # the running trial's start
        self.replay_at: float | None = None  # ... and its replay's start
        self.startups_s: list[float] = []  # each launch's start-up, this run
        self.replays_s: list[float] = []  # each whole replay (a trial COMPLETE), this run
        self.done_before = already_done
        self.done_now = 0
        self.maximize = maximize
        self.best = best  # the study's best including earlier runs
        self.started = time.monotonic()
        self.trials_started: float | None = None  # the first trial's start (after warm start)
        # A trial's start-up and replay (s) as estimated when the running trial started:
        # new measurements move the ETA between trials, never while one counts down.
        self.trial_estimate: tuple[float, float] | None = None
        self._counted: set[int] = set()

    def trial_started(self) -> None:
        """A trial starts: the first one starts the clock the pace ETA reads."""
        now = time.monotonic()
        if self.trials_started is None:
            self.trials_started = now
        self.trial_at, self.replay_at = now, None
        self.trial_estimate = self._estimate()

    def phase(self, phase: str) -> None:
        """The running trial's server is up and its replay begins: a start-up measured."""
        if phase == REPLAY_PHASE and self.trial_at is not None and self.replay_at is None:
            self.replay_at = time.monotonic()
            self.startups_s.append(self.replay_at - self.trial_at)

    def record(self, trial: FrozenTrial, study: optuna.Study) -> TrialRecord:
        """Count a finished trial once, however many displays report it; returns its record."""
        record = TrialRecord.read(trial.user_attrs)
        if trial.number in self._counted:
            return record
        self._counted.add(trial.number)
        if trial.state == TrialState.COMPLETE and record.measured and self.replay_at is not None:
            self.replays_s.append(time.monotonic() - self.replay_at)
        self.trial_at = self.replay_at = None
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):  # not FAIL (our own error)
            self.done_now += 1
        winner = TunerStudyRecord.read(study.user_attrs).winner
        if winner is not None and len(study.directions) == 1:
            self.best = Best(winner.trial, winner.mean, winner.measurements)
            return record
        value = trial.values[0] if trial.values else None
        feasible = all(v <= 0 for v in trial.constraints.values())
        if value is not None and feasible and record.measured:
            better = self.best is None or (
                value > self.best.value if self.maximize else value < self.best.value
            )
            if better:
                self.best = Best(trial.number, value)
        return record

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def eta_s(self) -> float | None:
        """Time left: the running trial's rest plus a whole trial for each not started,
        a trial being a start-up (as this run's took) and the replay the pre-flight
        predicted (once a replay ran whole here, as long as this run's took: a simulator
        on a busy host, or an uncalibrated one, is off). It only falls while a trial runs.
        Without a predicted replay: the pace of this run's trials so far (the warm start
        is not a trial's time)."""
        if not self.n_trials:
            return None
        left = max(self.n_trials - self.done_before - self.done_now, 0)
        if self.replay_wall_s is not None:
            return self._predicted_eta_s(left)
        if not self.done_now or self.trials_started is None:
            return None
        return (time.monotonic() - self.trials_started) / self.done_now * left

    def _estimate(self) -> tuple[float, float] | None:
        """A trial's start-up and replay seconds: this run's means, the replay predicted
        until one is measured."""
        if self.replay_wall_s is None:
            return None
        return _mean(self.startups_s, 0.0), _mean(self.replays_s, self.replay_wall_s)

    def _predicted_eta_s(self, left: int) -> float:
        now = time.monotonic()
        if self.trial_at is None or self.trial_estimate is None:  # between trials
            startup_s, replay_s = self._estimate() or (0.0, 0.0)
            return left * (startup_s + replay_s)
        startup_s, replay_s = self.trial_estimate
        if self.replay_at is None:  # the running trial is starting its server
            rest_s = max(startup_s - (now - self.trial_at), 0.0) + replay_s
        else:
            rest_s = max(replay_s - (now - self.replay_at), 0.0)
        return rest_s + max(left - 1, 0) * (startup_s + replay_s)

    def position(self, running: bool) -> str:
        position = self.done_before + self.done_now + (1 if running else 0)
        return f"{position}/{self.n_trials}" if self.n_trials else str(position)

    def best_text(self, metric: str) -> str:
        return self.best.text(metric) if self.best else "best -"


FAILURE_MESSAGE_CHARS = 200  # the engine's own line, on the trial's line


def failure_text(record: TrialRecord) -> str:
    """``: <the engine's own error line>`` for a server failure, else ""."""
    if record.failure is None or not record.failure.message:
        return ""
    return f": {record.failure.message[:FAILURE_MESSAGE_CHARS]}"


def trial_end_text(
    trial: FrozenTrial,
    outcome: str,
    study: optuna.Study,
    tally: Tally,
    *,
    metric: str,
    trial_started: float,
) -> str:
    """The line a finished trial gets (counting it in ``tally``): outcome, value, params,
    wall time, elapsed, ETA and the best so far."""
    record = tally.record(trial, study)
    if record.reason is not None:
        outcome = f"{outcome} ({record.reason})"
    if trial.state != TrialState.COMPLETE and record.error:
        outcome = f"{outcome}: {record.error}"
    value = trial.values[0] if trial.values and record.measured else None
    shown = f"{value:,.1f} {metric}" if value is not None else "no measurement"
    shown += failure_text(record)
    if trial.state == TrialState.PRUNED and record.replay and record.replay.stopped_early:
        shown = record.replay.stopped_early
    flags = dict(record.config.flags) if record.config else {}
    wall = record.wall_s if record.wall_s is not None else time.monotonic() - trial_started
    eta = tally.eta_s()
    return (
        f"trial {trial.number} [{tally.position(False)}] {outcome}: {shown}; "
        f"{params_text(trial.params, flags)}; {wall:.0f}s; "
        f"elapsed {_clock(tally.elapsed_s)}"
        + (f", ETA {_clock(eta)}" if eta is not None else "")
        + f"; {tally.best_text(metric)}"
    )


def stamped(text: str) -> str:
    """``text`` after the wall-clock time, as every progress line starts."""
    return f"{datetime.now().strftime('%H:%M:%S')} {text}"


class PlainProgress:
    """A StudyObserver writing one plain line per phase and per finished trial to ``write``."""

    def __init__(self, write: Callable[[str], None], tally: Tally, *, metric: str) -> None:
        self.write = write
        self.tally = tally
        self.metric = metric
        self.number: int | None = None
        self.phase = ""
        self.trial_started = time.monotonic()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def _line(self, text: str) -> None:
        self.write(stamped(text))

    def on_trial_start(
        self, number: int, params: dict[str, Any], flags: dict[str, Any], is_baseline: bool
    ) -> None:
        self.number, self.phase = number, ""
        self.trial_started = time.monotonic()
        self.tally.trial_started()
        baseline = " (baseline)" if is_baseline else ""
        position = self.tally.position(True)
        self._line(f"trial {number}{baseline} [{position}] starts: {params_text(params, flags)}")

    def on_phase(self, phase: str) -> None:
        self.tally.phase(phase)
        if phase != self.phase:  # the launcher and the engine may both announce one
            self.phase = phase
            self._line(phase if self.number is None else f"trial {self.number}: {phase}")

    def on_request_done(self, record: RequestRecord, done: int, total: int | None) -> None:
        return None  # one line per request would bury the trials

    def on_trial_end(self, trial: FrozenTrial, outcome: str, study: optuna.Study) -> None:
        self._line(
            trial_end_text(
                trial,
                outcome,
                study,
                self.tally,
                metric=self.metric,
                trial_started=self.trial_started,
            )
        )


class FanOut:
    """One StudyObserver that forwards every event to several."""

    def __init__(self, *observers: Any) -> None:
        self.observers = observers

    def on_trial_start(
        self, number: int, params: dict[str, Any], flags: dict[str, Any], is_baseline: bool
    ) -> None:
        for observer in self.observers:
            observer.on_trial_start(number, params, flags, is_baseline)

    def on_phase(self, phase: str) -> None:
        for observer in self.observers:
            observer.on_phase(phase)

    def on_request_done(self, record: RequestRecord, done: int, total: int | None) -> None:
        for observer in self.observers:
            observer.on_request_done(record, done, total)

    def on_trial_end(self, trial: FrozenTrial, outcome: str, study: optuna.Study) -> None:
        for observer in self.observers:
            observer.on_trial_end(trial, outcome, study)


class RichProgress:
    """A StudyObserver for a terminal: every finished trial's line, as plain mode writes
    it, above one live status line (trial, phase, best, elapsed, ETA)."""

    def __init__(self, console: Console, tally: Tally, *, metric: str) -> None:
        self.console = console
        self.tally = tally
        self.metric = metric
        self.trial_started = tally.started
        self.number: int | None = None
        self.phase = "starting"
        self.live = Live(_Status(self), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> RichProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.refresh()
        self.live.__exit__(*exc)

    # --- StudyObserver ---------------------------------------------------------

    def on_trial_start(
        self, number: int, params: dict[str, Any], flags: dict[str, Any], is_baseline: bool
    ) -> None:
        self.number = number
        self.trial_started = time.monotonic()
        self.tally.trial_started()
        self.phase = "baseline: launching" if is_baseline else "launching"
        self.live.refresh()

    def on_phase(self, phase: str) -> None:
        self.tally.phase(phase)
        if self.number is None:  # the study's own phases (warm start) stay on the screen
            self.live.console.print(phase, highlight=False, markup=False)
        self.phase = phase
        self.live.refresh()

    def on_request_done(self, record: RequestRecord, done: int, total: int | None) -> None:
        if not record.in_window:
            self.phase = f"warming up ({done} requests)"
        elif total:
            self.phase = f"replaying {100 * done / total:.0f}%"
        else:
            self.phase = f"replaying ({done} requests)"

    def on_trial_end(self, trial: FrozenTrial, outcome: str, study: optuna.Study) -> None:
        self.number, self.phase = None, "done"  # first: a redraw meanwhile counts it done
        text = trial_end_text(
            trial, outcome, study, self.tally, metric=self.metric, trial_started=self.trial_started
        )
        self.live.console.print(stamped(text), highlight=False, markup=False, soft_wrap=True)
        self.live.refresh()

    # --- drawing ---------------------------------------------------------------

    def status(self) -> Text:
        """The live line, as of now (Live asks for it at every refresh)."""
        tally = self.tally
        if self.number is not None:
            head = f"trial {self.number} [{tally.position(True)}]"
        else:
            head = f"{tally.position(False)} trials done"
        phase = f" · {self.phase}" if self.phase != "done" else ""
        eta_s = tally.eta_s()
        eta = f" · ETA {_clock(eta_s)}" if eta_s is not None else ""
        return Text.assemble(
            (head, "bold"),
            f"{phase} · ",
            (tally.best_text(self.metric), "green"),
            f" · elapsed {_clock(tally.elapsed_s)}{eta}",
        )


class _Status:
    """The live region's renderable: the status line computed when it is drawn."""

    def __init__(self, progress: RichProgress) -> None:
        self.progress = progress

    def __rich__(self) -> Text:
        return self.progress.status()
