"""The study-level verdict that stops a run whose first trials all fail the same way.

A server that crashes is a trial result, and the search goes on: one config's
failure says nothing of the next. But when the first ``SAME_FAILURE_TRIALS``
launches of a run all fail with the same failure class and the same engine
message, the cause is what every config shares (a fixed flag the engine
rejects, a missing plugin, a wrong model path), and every trial left in the
budget would fail the same way. The run stops there, the study keeps the
trials, and the verdict is stored (study attr ``verdict``) for the CLI to print
with the engine's own line.

Why 3: the baseline and two configs the sampler chose apart from it (the guided
sampler never launches a measured config twice) failing identically is no
coincidence of searched values, while a bad choice of one searched parameter
rarely comes up three times running. 3 launches of a config that fails at
argument parsing cost seconds; the budget is hours. Memory failures never
count: an OOM is the edge of the region the search is mapping, and its
message, with the same KV pool, can be the same for several configs.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial
from pydantic import BaseModel, ConfigDict

from autotune.trial.record import TrialRecord
from autotune.vocabulary import FailureClass, Outcome

SAME_FAILURE_TRIALS = 3
VERDICT_ATTR = "verdict"


class SameFailure(BaseModel):
    """Why the run stopped: the trials, their failure class and the engine's line."""

    model_config = ConfigDict(frozen=True)

    trials: tuple[int, ...]
    failure_class: FailureClass
    message: str

    def text(self) -> str:
        """One line for the screen and run.log."""
        numbers = ", ".join(str(number) for number in self.trials)
        return (
            f"stopped: the first {len(self.trials)} launches (trials {numbers}) all failed the "
            f"same way ({self.failure_class.value}): the cause is what every config shares, "
            f"and the rest of the budget would fail alike. The engine said: {self.message}"
        )


class SameFailureWatch:
    """An Optuna callback: stops the study once the first launches of this run have all
    failed identically; stands down for good at the first launch that did not."""

    def __init__(self, study: optuna.Study, *, trials: int = SAME_FAILURE_TRIALS) -> None:
        self.needed = trials
        self.failures: list[tuple[int, FailureClass, str]] = []
        self.verdict: SameFailure | None = None
        # A study that measured something already has a config that works.
        trials = study.get_trials(deepcopy=False)
        self.armed = not any(TrialRecord.read(trial.user_attrs).measured for trial in trials)

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if not self.armed:
            return
        record = TrialRecord.read(trial.user_attrs)
        if record.measured:
            self.armed = False
            return
        failure = record.failure
        if failure is None or record.outcome == Outcome.TRIAL_TIMEOUT:
            return  # not launched (predicted OOM, duplicate, a rule), our own error, too slow
        if failure.failure_class.is_oom:
            self.armed = False
            return
        seen = (trial.number, failure.failure_class, failure.message)
        if self.failures and self.failures[0][1:] != seen[1:]:
            self.armed = False
            return
        self.failures.append(seen)
        if len(self.failures) >= self.needed:
            self.armed = False
            self.verdict = SameFailure(
                trials=tuple(number for number, _, _ in self.failures),
                failure_class=failure.failure_class,
                message=failure.message,
            )
            study.set_user_attr(VERDICT_ATTR, self.verdict.model_dump(mode="json"))
            study.stop()


def stored_verdict(study: optuna.Study) -> SameFailure | None:
    """The verdict the latest run stored, if it stopped on one."""
    raw = study.user_attrs.get(VERDICT_ATTR)
    return SameFailure.model_validate(raw) if raw else None
