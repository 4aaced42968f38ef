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


def crown(
    index: MeasuredIndex, *, maximize: bool, sampler: GuidedSampler | None = None
) -> Measured | None:
    """The config to hand over, or None when nothing feasible was measured."""
    best = ranked(index, maximize=maximize, sampler=sampler)
    return best[0] if best else None
