"""Stop hopeless trials early: a trial whose throughput so far is well below the best's.

The replay reports the window's output throughput every few percent of its
budget (``replay.load_policy.Progress``); the study hands each report to
``trial.report(value, step)`` and stops the replay when ``trial.should_prune()``.

``BelowBestPruner`` prunes only when, after ``min_step`` percent of the replay,
the trial's throughput so far is below ``1 - margin`` of the best measured
feasible trial's: the lowest of that trial's final value and its own throughput
over the last ``slack`` percent up to the same step. The throughput so far
ramps up as the first requests complete, alike in every trial but not in step:
a trial a few requests behind on a steep ramp is not hopeless. The margin is
wide against 3% run-to-run noise and a partial window's own spread: a trial
10% behind the best is still measured, since the tuner learns from it and
confirmation may crown it.

A pruned trial is Optuna's PRUNED with outcome ``pruned``; its replay, stats so
far included, is stored, but it is not a measurement (``measured`` false): the
tuner does not learn from it nor crown it, and never launches it again. Optuna
keeps its last reported value as the trial's value, which samplers such as TPE
read as a pruned trial's (a partial window's throughput: an estimate, often
high, of what it would have finished at).
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.replay.load_policy import Progress
from autotune.trial.record import TrialRecord

PRUNE_MARGIN = 0.2  # prune below 80% of the best
PRUNE_MIN_STEP = 20  # never before 20% of the replay's budget
PRUNE_SLACK = 10  # compare with the best's throughput up to 10% of the replay earlier


class BelowBestPruner(optuna.pruners.BasePruner):
    """See the module docstring; maximize studies with one objective only."""

    def __init__(
        self,
        margin: float = PRUNE_MARGIN,
        min_step: int = PRUNE_MIN_STEP,
        slack: int = PRUNE_SLACK,
    ) -> None:
        self.margin = margin
        self.min_step = min_step
        self.slack = slack

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.min_step:
            return False
        best = best_measured(study)
        if best is None:
            return False
        near = [v for s, v in best.intermediate_values.items() if step - self.slack <= s <= step]
        reference = min([best.value, *near])
        return trial.intermediate_values[step] < (1.0 - self.margin) * reference


def best_measured(study: optuna.Study) -> FrozenTrial | None:
    """The COMPLETE, measured, feasible trial with the highest value (None: none yet)."""
    candidates = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if trial.values is not None
        and TrialRecord.read(trial.user_attrs).measured
        and all(v <= 0 for v in trial.constraints.values())
    ]
    return max(candidates, key=lambda trial: trial.values[0], default=None)


class PruneJudge:
    """One trial's ``on_progress``: reports each step to Optuna, says when to stop (never
    with ``may_stop`` false: the baseline's steps are reported for later trials to meet)."""

    def __init__(self, trial: optuna.Trial, *, may_stop: bool = True) -> None:
        self.trial = trial
        self.may_stop = may_stop
        self.pruned_at: Progress | None = None

    def __call__(self, progress: Progress) -> bool:
        self.trial.report(progress.output_tok_s, progress.step)
        if self.may_stop and self.trial.should_prune():
            self.pruned_at = progress
            return True
        return False
