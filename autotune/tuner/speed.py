"""Recalibration of the card's speed: the simulator's efficiencies fitted to the trials.

The roofline takes the catalog's peaks times its efficiencies (``SpeedConstants``: HBM
bandwidth, decode and prefill compute). A card, driver or kernel that reaches less
than the catalog assumes does not slow every config alike: slower compute costs MTP's
verify tokens and long prefill chunks more than a small decode step. On cc-traces-24g
(compute 25% slower than the simulator's) the simulator ranks MTP 3 about 4% above MTP 2
at the memory edge, where the truth ranks them the other way (docs/benchmarks.md).

``SpeedFit`` keeps what every measured trial reported (mean output throughput, TTFT and
TPOT) and fits two factors: one on bandwidth, one on compute (decode and prefill alike:
the same tensor cores and kernels; fitted apart, trials that all ran one family, say MTP
3 at a few seats, pinned prefill compute and left decode compute to noise, and the
simulator then misranked the families it had not measured). The MAP estimate on a grid
of ``STEP`` in log,
under a Gaussian prior of ``PRIOR_SD`` on each log factor and a log error of ``NOISE`` per
figure. The walk starts at the last fit and moves to the best neighbour (each factor a
step either way, or kept) until none is better. A fit is taken only when it lowers the
misfit by ``EVIDENCE`` against the catalog's efficiencies (chi-square, two degrees of
freedom, p = 0.01): run-to-run noise alone does not move the simulator. Figures are
predicted with the MTP acceptance measured so far (``tuner.acceptance``), so the two fits
do not trade MTP's speed between them. It fits at 3 measured trials, then each time their
count has grown by half (``GROWTH``): a handful of fits a night, each a few hundred
predictions of launched configs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autotune.config.trial_config import TrialConfig
from autotune.replay.records import ReplayStats
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.speed_constants import BOUNDS, SpeedConstants, gpu_constants
from autotune.tuner.lattice import config_key
from autotune.tuner.predictor import SimOracle

# Each fitted factor and the efficiencies it scales.
FITTED = (("bandwidth_efficiency",), ("compute_efficiency", "prefill_compute_efficiency"))
STEP = 0.05  # the grid's step on each log factor (about 5%)
MAX_STEPS = 14  # the walk goes at most this many steps from 1.0 (a factor of 2)
PRIOR_SD = 0.3  # the catalog's efficiencies are off by up to ~30% between cards
NOISE = 0.04  # one measured figure's run-to-run noise, log scale (as `sim calibrate` takes it)
EVIDENCE = 9.21  # chi-square 0.99 quantile, 2 degrees of freedom
# A fit replaces the one taken only when it explains the figures this much better (twice
# the log-likelihood ratio; a neighbour on the grid within the noise does not re-rank).
HYSTERESIS = 2.0
FIRST_FIT = 3  # measured trials before the first fit
GROWTH = 1.5  # the next fit waits for this many times the trials of the last one
Steps = tuple[int, int]  # each fitted factor (``FITTED``): exp(STEP x steps)
NO_STEPS: Steps = (0, 0)


@dataclass(frozen=True)
class Sample:
    """One measured trial: what launched and its mean throughput, TTFT and TPOT (None:
    not reported)."""

    config: TrialConfig
    figures: tuple[float | None, float | None, float | None]


def figures_of(stats: ReplayStats) -> tuple[float | None, float | None, float | None]:
    """Mean output tok/s, TTFT and TPOT of a replay (None where it has none)."""
    throughput = stats.output_throughput_tok_s or None
    return throughput, stats.ttft.mean or None, stats.tpot.mean or None


def base_constants(oracle: SimOracle) -> SpeedConstants:
    """The constants ``oracle`` predicts with: its profile's, else its GPU's."""
    if oracle.calibration is not None:
        return oracle.calibration.constants
    return gpu_constants(oracle.hardware)


def scaled(constants: SpeedConstants, steps: Steps) -> SpeedConstants:
    """``constants`` with each fitted efficiency times its factor, within ``BOUNDS``."""
    update = {}
    for names, step in zip(FITTED, steps, strict=True):
        for name in names:
            low, high = BOUNDS[name]
            value = getattr(constants, name) * math.exp(STEP * step)
            update[name] = min(high, max(low, value))
    return constants.model_copy(update=update)


def with_constants(oracle: SimOracle, constants: SpeedConstants, source: str) -> SimOracle:
    """``oracle`` predicting with ``constants`` (its profile's provenance kept)."""
    profile = oracle.calibration or CalibrationProfile(source=source)
    return replace(oracle, calibration=profile.model_copy(update={"constants": constants}))


def calibrated(
    oracle: SimOracle, rates: tuple[float, ...] | None, steps: Steps = NO_STEPS
) -> SimOracle:
    """``oracle`` predicting with ``rates`` as its MTP acceptance (None: its own) and its
    efficiencies scaled by ``steps``; its other constants kept (its profile's, else its
    GPU's)."""
    constants = scaled(base_constants(oracle), steps)
    if rates is not None:
        constants = constants.model_copy(update={"mtp_acceptance": rates})
    return with_constants(oracle, constants, "measured acceptance and speed")


def factors(steps: Steps) -> tuple[float, ...]:
    return tuple(math.exp(STEP * step) for step in steps)


class SpeedFit:
    """The trials measured so far and the efficiency factors fitted to them."""

    def __init__(self, oracle: SimOracle) -> None:
        self.oracle = oracle
        self.samples: dict[int, Sample] = {}  # by trial number
        self.steps: Steps = NO_STEPS  # the last fit taken
        self.fitted_on = 0  # samples behind the last fit (taken or not)
        self._memo: dict[tuple, tuple[float | None, ...] | None] = {}

    def observe(self, trial: int, config: TrialConfig, stats: ReplayStats) -> None:
        self.samples[trial] = Sample(config, figures_of(stats))

    def due(self) -> bool:
        """Whether enough trials were measured since the last fit to fit again."""
        count = len(self.samples)
        return count >= FIRST_FIT and count >= math.ceil(self.fitted_on * GROWTH)

    def fit(self, acceptance: tuple[float, ...] | None) -> Steps:
        """Fit the factors to every sample (the module docstring), predicting MTP configs
        with ``acceptance`` (None: the oracle's own); the factors taken."""
        samples = list(self.samples.values())
        self.fitted_on = len(samples)
        cost: dict[Steps, float] = {}

        def misfit(steps: Steps) -> float:
            if steps not in cost:
                cost[steps] = self._misfit(samples, steps, acceptance)
            return cost[steps]

        here = self.steps
        while True:
            near = [(here[0] + a, here[1] + b) for a, b in itertools.product((-1, 0, 1), repeat=2)]
            near = [steps for steps in near if max(map(abs, steps)) <= MAX_STEPS]
            best = min(near, key=misfit)
            if misfit(best) >= misfit(here):
                break
            here = best
        if misfit(NO_STEPS) - misfit(here) < EVIDENCE:
            self.steps = NO_STEPS
        elif misfit(self.steps) - misfit(here) >= HYSTERESIS:
            self.steps = here
        return self.steps

    def _misfit(
        self, samples: Sequence[Sample], steps: Steps, acceptance: tuple[float, ...] | None
    ) -> float:
        """Squared log errors of the predicted figures over ``NOISE``, plus the prior's."""
        total = sum((STEP * step / PRIOR_SD) ** 2 for step in steps)
        for sample in samples:
            predicted = self._predicted(sample.config, steps, acceptance)
            for measured, figure in zip(sample.figures, predicted or (), strict=False):
                if measured is not None and figure:
                    total += (math.log(figure / measured) / NOISE) ** 2
        return total

    def _predicted(
        self, config: TrialConfig, steps: Steps, acceptance: tuple[float, ...] | None
    ) -> tuple[float | None, ...] | None:
        key = (config_key(config), steps, acceptance)
        if key not in self._memo:
            prediction = calibrated(self.oracle, acceptance, steps).predict(config)
            ok = prediction is not None and prediction.failure is None
            self._memo[key] = figures_of(prediction.stats) if ok else None
        return self._memo[key]

    def describe(self) -> str:
        """The factors taken, as the study's log says them."""
        bandwidth, compute = factors(self.steps)
        return (
            f"the card's speed against the simulator's: bandwidth x{bandwidth:.2f}, compute "
            f"x{compute:.2f} (fitted to {self.fitted_on} trials' throughput, TTFT and TPOT)"
        )
