"""The live display's clock and ETA, with rich's own Live on a terminal-like console."""

from __future__ import annotations

import io
import time

import optuna
from optuna.trial import TrialState
from rich.console import Console

from autotune.cli.progress import RichProgress, Tally


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=160, color_system=None), buffer


def test_the_status_line_keeps_counting_while_nothing_happens() -> None:
    """Before: drawn once per event, it froze at `elapsed 0:00` through a long warm start."""
    console, screen = _console()
    progress = RichProgress(console, Tally(n_trials=4, already_done=0, maximize=True), metric="x")
    with progress:
        progress.on_phase("warm start: predicting 200 configs")
        time.sleep(1.6)
        drawn = screen.getvalue()  # what the terminal got before the display closed
    assert "warm start: predicting 200 configs" in drawn
    assert "elapsed 0:01" in drawn


def test_the_eta_runs_at_the_trials_pace_not_the_warm_start_s() -> None:
    """Before: elapsed since the start (warm start included) / trials done: 59:38 for 5 min."""
    study = optuna.create_study(direction="maximize")
    study.add_trial(
        optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0, params={}, distributions={})
    )
    tally = Tally(n_trials=11, already_done=0, maximize=True)
    console, _ = _console()
    progress = RichProgress(console, tally, metric="x")
    with progress:
        time.sleep(1.0)  # the warm start
        progress.on_trial_start(0, {}, {}, is_baseline=True)
        time.sleep(0.1)  # the first trial
        progress.on_trial_end(study.trials[0], "ok", study)
        eta_s = tally.eta_s()
    assert eta_s is not None
    assert 0.9 <= eta_s <= 4.0  # 10 more trials of ~0.1 s (on a busy host, some more)
