"""GuidedSampler: the next launch is the lattice config with the best optimistic estimate.

estimate = predicted utility + learned residual (autotune.tuner.residual) +
``EXPLORATION`` x its posterior spread, over the effective configs not measured
yet (nor predicted to behave exactly like a measured one, nor presumed to OOM after an
OOM launch: ``Guide.ruled_out``).
Without learning the estimate is the prediction alone. When no config left is
predicted feasible (an SLO out of reach), the next is the one predicted nearest
to feasible (``Guide.nearest``), never one predicted to OOM; then one the warm
start had no time to predict (each passed the memory pre-screen, so no proposal
spends a trial on a predicted OOM). When the lattice has nothing left,
parameters come from a random sampler.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial

from autotune.tuner.drift import fit
from autotune.tuner.guide import Guide
from autotune.tuner.measured import MeasuredIndex
from autotune.tuner.residual import ResidualModel

EXPLORATION = 1.0  # posterior standard deviations added to the mean


class GuidedSampler(BaseSampler):
    """Picks whole configs from the guide; see the module docstring."""

    def __init__(
        self,
        guide: Guide,
        index: MeasuredIndex,
        distributions: dict[str, BaseDistribution],
        *,
        maximize: bool = True,
        learn: bool = True,
        seed: int | None = None,
    ) -> None:
        self.guide = guide
        self.index = index
        self.distributions = distributions
        self.maximize = maximize
        self.learn = learn
        self._fallback = RandomSampler(seed=seed)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if trial.system_attrs.get("fixed_params"):
            return {}  # an enqueued trial (baseline, seed, confirmation)
        while True:  # a pick the screen alone scored is replayed, then the pick made again
            pick = self._pick()
            if pick is None or not self.guide.settle([pick]):
                break
        return {} if pick is None else dict(self.guide.candidates[pick].params)

    def exhausted(self) -> bool:
        """Nothing left to propose but the random fallback: every lattice config is
        measured, being measured, ruled out or predicted not to start."""
        return self._pick() is None

    def _pick(self) -> int | None:
        """The best optimistic estimate not tried, else the nearest to feasible."""
        mean, spread = self.estimates()
        estimate = mean + EXPLORATION * spread
        tried = self.guide.ruled_out(set(self.index.by_key) | self.index.pending)
        estimate = np.where(tried | ~np.isfinite(estimate), -np.inf, estimate)
        if len(estimate) and np.isfinite(estimate.max()):
            return int(np.argmax(estimate))
        nearest = [i for i in self.guide.nearest() if not tried[i]]
        return nearest[0] if nearest else None

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def residual_model(self) -> ResidualModel | None:
        """The residual posterior from every feasible measured lattice config, if learning."""
        if not self.learn:
            return None
        rows, residuals = [], []
        levels = fit(self.index, maximize=self.maximize)
        for entry in self.index.by_key.values():
            index = self.guide.by_key.get(entry.key)
            if index is None or entry.key not in levels.level:
                continue
            if not np.isfinite(self.guide.utility[index]):
                continue
            rows.append(self.guide.coords[index])
            residuals.append(levels.level[entry.key] - self.guide.utility[index])
        if not rows:
            return None
        return ResidualModel(np.array(rows), np.array(residuals))

    def estimates(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and spread of every candidate's utility."""
        model = self.residual_model()
        if model is None:
            return self.guide.utility, np.zeros_like(self.guide.utility)
        mean, spread = model.predict(self.guide.coords)
        return self.guide.utility + mean, spread
