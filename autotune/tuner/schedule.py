"""The tuner's say in what a trial launches: warm-start seeds and re-measurements.

``ScheduledSampler`` wraps the study's sampler (guided, GP, TPE, random, grid).
Before each trial it asks the tuner for a ``Role``: a warm-start seed, a
re-measurement of a top candidate, or none, and then the wrapped sampler picks
as usual. Nothing is enqueued, so a study never holds a seed or a confirmation
it did not run, and ``--trials`` counts them like any other trial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState


@dataclass(frozen=True)
class Role:
    """A trial the tuner chose: its params and why."""

    params: dict[str, Any]
    warm_start: int | None = None  # rank of the seed (1: predicted best)
    confirms: int | None = None  # the trial whose config this re-measures
    neighbour_of: int | None = None  # the measured trial whose off-lattice neighbour this is

    def attrs(self) -> dict[str, int]:
        """The trial attrs that say why it was launched (``TrialRecord`` fields)."""
        found = {
            "warm_start": self.warm_start,
            "confirms": self.confirms,
            "neighbour_of": self.neighbour_of,
        }
        return {key: value for key, value in found.items() if value is not None}


class Scheduler(Protocol):
    """What the wrapper asks (``autotune.tuner.session.Tuner``)."""

    def next_role(self, study: optuna.Study, trial: FrozenTrial) -> Role | None: ...

    def crowned(self) -> Any: ...


class ScheduledSampler(BaseSampler):
    """See the module docstring; ``scheduler.next_role`` gives a new trial's role, or None."""

    def __init__(
        self,
        base: BaseSampler,
        scheduler: Scheduler,
        distributions: dict[str, BaseDistribution],
    ) -> None:
        self.base = base
        self.scheduler = scheduler
        self.distributions = distributions
        self.roles: dict[int, Role] = {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        enqueued = "fixed_params" in trial.system_attrs
        role = None if enqueued else self.scheduler.next_role(study, trial)
        if role is None:
            self.base.before_trial(study, trial)
        else:
            self.roles[trial.number] = role
            for key, value in role.attrs().items():  # seen by other workers from now on
                study._storage.set_trial_user_attr(trial._trial_id, key, value)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if trial.number in self.roles:
            return dict(self.distributions)
        if "fixed_params" in trial.system_attrs:
            return {}  # enqueued (the baseline, a retry): nothing to sample
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        role = self.roles.get(trial.number)
        if role is not None:
            return dict(role.params)
        if not search_space:
            return {}
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        if trial.number not in self.roles:  # e.g. GridSampler reads its grid id here
            self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
