"""Live progress of a study with rich: trial n/N, phase, best so far, elapsed, ETA."""

from __future__ import annotations

import time
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.replay.records import RequestRecord
from autotune.trial_record import TrialRecord


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class RichProgress:
    """A StudyObserver that draws a live status line and the finished trials."""

    def __init__(
        self,
        console: Console,
        *,
        n_trials: int | None,
        already_done: int,
        metric: str,
        maximize: bool,
    ) -> None:
        self.console = console
        self.n_trials = n_trials
        self.done_before = already_done
        self.done_now = 0
        self.metric = metric
        self.maximize = maximize
        self.started = time.monotonic()
        self.trial_started = self.started
        self.number: int | None = None
        self.phase = "starting"
        self.requests_done = 0
        self.requests_total: int | None = None
        self.best: tuple[int, float] | None = None
        self.rows: list[tuple[str, ...]] = []
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> RichProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.update(self._render())
        self.live.__exit__(*exc)

    # --- StudyObserver ---------------------------------------------------------

    def on_trial_start(self, number: int, params: dict[str, Any], is_baseline: bool) -> None:
        self.number = number
        self.trial_started = time.monotonic()
        self.phase = "baseline: launching" if is_baseline else "launching"
        self.requests_done, self.requests_total = 0, None
        self._refresh()

    def on_phase(self, phase: str) -> None:
        self.phase = phase
        self._refresh()

    def on_request_done(self, record: RequestRecord, done: int, total: int | None) -> None:
        self.requests_done, self.requests_total = done, total
        if not record.in_window:
            self.phase = f"warming up ({done} requests)"
        elif total:
            self.phase = f"replaying {100 * done / total:.0f}%"
        else:
            self.phase = f"replaying ({done} requests)"
        self._refresh()

    def on_trial_end(self, trial: FrozenTrial, outcome: str, study: optuna.Study) -> None:
        record = TrialRecord.read(trial.user_attrs)
        if trial.state == TrialState.COMPLETE:  # FAIL (our own error) does not count
            self.done_now += 1
        elif record.error:
            outcome = f"{outcome}: {record.error}"[:60]
        value = trial.values[0] if trial.values else None
        feasible = all(v <= 0 for v in trial.constraints.values())
        if value is not None and feasible and record.measured:
            better = self.best is None or (
                value > self.best[1] if self.maximize else value < self.best[1]
            )
            if better:
                self.best = (trial.number, value)
        shown = f"{value:,.1f}" if value is not None and record.measured else "-"
        wall = record.wall_s
        self.rows.append(
            (str(trial.number), outcome, shown, f"{wall:.0f}s" if wall is not None else "")
        )
        self.phase = "done"
        self._refresh()

    # --- drawing ---------------------------------------------------------------

    def _refresh(self) -> None:
        self.live.update(self._render())

    def _render(self) -> Group:
        elapsed = time.monotonic() - self.started
        total = self.n_trials
        position = self.done_before + self.done_now + (0 if self.phase == "done" else 1)
        trial_text = f"trial {position}/{total}" if total else f"trial {position}"
        best = (
            f"best {self.best[1]:,.1f} {self.metric} (#{self.best[0]})" if self.best else "best -"
        )
        eta = ""
        if total and self.done_now:
            per_trial = elapsed / self.done_now
            left = max(total - self.done_before - self.done_now, 0)
            eta = f" · ETA {_clock(per_trial * left)}"
        status = Text.assemble(
            (trial_text, "bold"),
            f" · {self.phase} · ",
            (best, "green"),
            f" · elapsed {_clock(elapsed)}{eta}",
        )
        table = Table(box=None, pad_edge=False, show_header=bool(self.rows))
        for column in ("trial", "outcome", self.metric, "wall"):
            table.add_column(column, justify="right" if column != "outcome" else "left")
        for row in self.rows[-8:]:
            table.add_row(*row)
        return Group(table, status)
