"""What each measured config serves, seen through drift and the odd bad run.

Two things make raw means mislead over a night. Drift: the hardware may slow as the
night goes on (clocks fall as it heats, a neighbour takes power), so a config first
measured late looks worse than one measured early, and a leader re-measured late loses
its crown to a weaker config measured once early. Odd runs: now and then one run is far
off (a neighbour on the GPU, a stalled client), and one such run decides a mean of two
or three. ``fit`` reads both from the measurements themselves: every config its own
level, one slope of log value against the trial number (fitted within configs, so from
the configs measured more than once, and shrunk toward no drift by a prior of
``PRIOR_SD`` a trial), each run weighted down the further it lies from its config's level
beyond ``HUBER_K`` noise units (Huber's M-estimate, by iterated reweighting). A config's
level is at trial 0; its weight is how many runs its level rests on. Without
re-measurements, drift or odd runs, levels are the log means and weights the counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.tuner.guide import utility_of
from autotune.tuner.measured import MEASUREMENT_SD, Measured, MeasuredIndex

# How large a drift per trial (log scale) is believed before any re-measurement shows
# one: 0.2% a trial, 6% over a 30-trial night (a few re-measured configs with an odd run
# among them must not read a steep drift into it).
PRIOR_SD = 0.002
# A run further than this many noise units from its level counts less: Huber's constant
# (95% as efficient as the mean on normal noise). Run-to-run noise has heavier tails than
# a normal's; on the harsh bench's (Student-t, 3 dof) the levels are ~7% tighter than at
# 2.0 (docs/benchmarks.md, "Levels under heavy tails").
HUBER_K = 1.345
ROUNDS = 5  # reweighting rounds (each one a weighted least-squares fit)


@dataclass(frozen=True)
class Levels:
    """The fit: utility lost (negative) or gained per trial, and per config key its level
    (utility at trial 0) and the runs it rests on (its Huber weights summed)."""

    slope: float
    level: dict[str, float]
    weight: dict[str, float]
    noise: float  # pooled spread of a run about its level (log scale; 0: nothing re-measured)
    runs: dict[str, list[float]]  # per config key, each run's utility moved back to trial 0


def fit(index: MeasuredIndex, *, maximize: bool) -> Levels:
    """Levels and drift of every feasible measured config of ``index``."""
    entries = [entry for entry in index.by_key.values() if entry.feasible and entry.samples]
    runs = {entry.key: _runs(entry, maximize) for entry in entries}
    weights = {key: [1.0] * len(found) for key, found in runs.items()}
    slope, levels = 0.0, {}
    for _ in range(ROUNDS):
        slope = _slope(runs, weights)
        levels = {
            key: sum(w * (u - slope * t) for (t, u), w in zip(found, weights[key], strict=True))
            / sum(weights[key])
            for key, found in runs.items()
        }
        weights = {
            key: [_huber(u - slope * t - levels[key]) for t, u in found]
            for key, found in runs.items()
        }
    return Levels(
        slope=slope,
        level=levels,
        weight={key: sum(found) for key, found in weights.items()},
        noise=_noise(runs, weights, slope, levels),
        runs={key: [u - slope * t for t, u in found] for key, found in runs.items()},
    )


def _runs(entry: Measured, maximize: bool) -> list[tuple[int, float]]:
    """(trial, utility) of each run of ``entry``."""
    return [
        (trial, utility_of(value, maximize))
        for trial, value in zip(entry.sample_trials, entry.samples, strict=True)
    ]


def _slope(runs: dict[str, list[tuple[int, float]]], weights: dict[str, list[float]]) -> float:
    """Weighted within-config least squares of utility on trial, shrunk toward 0."""
    sxx = sxy = 0.0
    for key, found in runs.items():
        if len(found) < 2:
            continue
        w = weights[key]
        total = sum(w)
        mean_t = sum(wi * t for (t, _), wi in zip(found, w, strict=True)) / total
        mean_u = sum(wi * u for (_, u), wi in zip(found, w, strict=True)) / total
        for (t, u), wi in zip(found, w, strict=True):
            sxx += wi * (t - mean_t) ** 2
            sxy += wi * (t - mean_t) * (u - mean_u)
    return sxy / (sxx + (MEASUREMENT_SD / PRIOR_SD) ** 2)


def _huber(residual: float) -> float:
    """A run's weight: 1 within ``HUBER_K`` noise units of its level, less beyond."""
    limit = HUBER_K * MEASUREMENT_SD
    return 1.0 if abs(residual) <= limit else limit / abs(residual)


def _noise(
    runs: dict[str, list[tuple[int, float]]],
    weights: dict[str, list[float]],
    slope: float,
    levels: dict[str, float],
) -> float:
    """Weighted pooled standard deviation of a run about its config's level."""
    squares = freedom = 0.0
    for key, found in runs.items():
        if len(found) < 2:
            continue
        w = weights[key]
        squares += sum(
            wi * (u - slope * t - levels[key]) ** 2 for (t, u), wi in zip(found, w, strict=True)
        )
        freedom += sum(w) * (len(found) - 1) / len(found)
    return math.sqrt(squares / freedom) if freedom else 0.0
