"""Noise: re-measure the best candidates, then crown the config the evidence favours.

A config's estimate combines its measurements (mean utility, run-to-run noise
``NOISE_SD`` each) with what the simulator plus the learned residual says
about it, weighted by their precisions; without a guide it is the mean of the
measurements. The crowned config is the best estimate among configs that
never failed; ``confirmation_targets`` are the top few, re-measured before
crowning so that a config is never handed over on one lucky run.
"""

from __future__ import annotations

import math

from autotune.tuner.guide import utility_of
from autotune.tuner.measured import Measured, MeasuredIndex
from autotune.tuner.residual import NOISE_SD
from autotune.tuner.sampler import GuidedSampler

MEASUREMENT_SD = 0.03  # run-to-run spread of one measurement (log scale)
DUEL_Z = 2.0  # a challenger further behind than this many noise units is not worth a launch


def estimates(
    index: MeasuredIndex, *, maximize: bool, sampler: GuidedSampler | None = None
) -> dict[str, float]:
    """Estimated utility of every feasible measured config."""
    prior = None
    if sampler is not None and sampler.learn:
        mean, spread = sampler.estimates()
        prior = (sampler.guide.by_key, mean, spread)
    result: dict[str, float] = {}
    for entry in index.by_key.values():
        if not entry.feasible or not entry.samples:
            continue
        measured = utility_of(entry.mean, maximize)
        weight = len(entry.samples) / MEASUREMENT_SD**2
        estimate = measured
        if prior is not None and entry.key in prior[0]:
            at = prior[0][entry.key]
            if math.isfinite(prior[1][at]):
                prior_var = prior[2][at] ** 2 + NOISE_SD**2
                estimate = (weight * measured + prior[1][at] / prior_var) / (weight + 1 / prior_var)
        result[entry.key] = estimate
    return result


def ranked(
    index: MeasuredIndex, *, maximize: bool, sampler: GuidedSampler | None = None
) -> list[Measured]:
    """Feasible measured configs, best estimate first."""
    scores = estimates(index, maximize=maximize, sampler=sampler)
    return sorted((index.by_key[key] for key in scores), key=lambda e: -scores[e.key])


def confirmation_targets(
    index: MeasuredIndex, count: int, *, maximize: bool, sampler: GuidedSampler | None = None
) -> list[Measured]:
    """The ``count`` best configs by estimate: each is measured once more."""
    return ranked(index, maximize=maximize, sampler=sampler)[:count]


def duel(
    index: MeasuredIndex, *, maximize: bool, sampler: GuidedSampler | None = None, top: int = 5
) -> Measured | None:
    """The config whose next measurement can most change the crown: of the leader and its
    closest challenger (smallest gap in units of their measurement noise), the one
    measured less often; None when nothing was measured or no challenger is within
    ``DUEL_Z`` noise units."""
    scores = estimates(index, maximize=maximize, sampler=sampler)
    best = sorted(scores, key=lambda key: -scores[key])[:top]
    if not best:
        return None
    leader = index.by_key[best[0]]

    def z(entry: Measured) -> float:
        noise = MEASUREMENT_SD * math.sqrt(1 / len(leader.samples) + 1 / len(entry.samples))
        return (scores[leader.key] - scores[entry.key]) / noise

    challengers = [index.by_key[key] for key in best[1:]]
    if not challengers:
        return leader if len(leader.samples) < 2 else None
    challenger = min(challengers, key=z)
    if z(challenger) > DUEL_Z:
        return None
    return leader if len(leader.samples) < len(challenger.samples) else challenger


def crown(
    index: MeasuredIndex, *, maximize: bool, sampler: GuidedSampler | None = None
) -> Measured | None:
    """The config to hand over, or None when nothing feasible was measured."""
    best = ranked(index, maximize=maximize, sampler=sampler)
    return best[0] if best else None
