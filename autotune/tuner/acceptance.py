"""Recalibration: the MTP acceptance measured trials report, fed back into the simulator.

A launched MTP config reports in /metrics how often each draft position was accepted
(``ServerStats.spec_decode_acceptance_per_position``). The simulator's acceptance is the
catalog's for the workload's kind, and where it is wrong it misranks every MTP config
together (docs/measurements/history.md, readme-misled: drafts 2-3 accepted at a tenth of it put
the truth's optimum at #199). ``pooled`` estimates the acceptance from every measured
trial, position by position, weighted by its drafts; a position deeper than any measured
keeps the catalog's ratio to the one before it. ``Recalibration.update`` turns an
estimate that moved the mean accepted length by more than ``THRESHOLD`` (or, after a
first recalibration, one that measures a position the last one extrapolated) into a calibrated
oracle (``SimOracle.calibration`` with that acceptance), re-predicts the guide's MTP
configs with it (the two tiers of ``tuner.two_tier``: every one screened, the best
replayed) and replaces their predicted
utility: the sampler re-ranks, the learned residual is taken against the new values, and
the refiner predicts with the calibrated oracle. Predictions under a calibration are
cached under a key that names it (``CalibratedCache``); rates are rounded to ``ROUND``,
so equal estimates share their predictions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass, replace

from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.virtual.predict import catalog_acceptance
from autotune.trial.objective import Score
from autotune.tuner.guide import Guide, PredictionCache
from autotune.tuner.lattice import Candidate
from autotune.tuner.predictor import SimOracle
from autotune.tuner.two_tier import predict_two_tier
from autotune.vocabulary import ServerStats

# Re-predict when the mean accepted length moved by more than this: well above what one
# trial's thousands of drafts leave uncertain. It was 10% while the simulator drew every
# request's acceptance from one shared stream (a 0.1% change moved an MTP prediction by up
# to 3.5%); with common random numbers (sim/model/scheduler.py) a 3% move re-ranks the space
# without reshuffling it (docs/measurements/history.md: README truthful 18/20 within 1%,
# 15/20 at 10%).
THRESHOLD = 0.03
ROUND = 0.005  # estimated rates are rounded to this (equal estimates: one cache key)


@dataclass(frozen=True)
class Observation:
    """One measured trial's per-position acceptance and the drafts behind it."""

    rates: tuple[float, ...]
    drafts: int


def observation(stats: ServerStats | None) -> Observation | None:
    """What ``stats`` says about acceptance (None: no MTP, or the server does not say)."""
    if stats is None or not stats.spec_decode_acceptance_per_position:
        return None
    if not stats.spec_decode_drafts:
        return None
    return Observation(stats.spec_decode_acceptance_per_position, stats.spec_decode_drafts)


def prior_acceptance(oracle: SimOracle) -> tuple[float, ...]:
    """The per-position acceptance ``oracle`` predicts with (as ``predict`` chooses it)."""
    if oracle.calibration is not None and oracle.calibration.constants.mtp_acceptance:
        return tuple(oracle.calibration.constants.mtp_acceptance)
    return catalog_acceptance(oracle.sim_model, oracle.plan)


def pooled(observations: Sequence[Observation], prior: Sequence[float]) -> tuple[float, ...]:
    """Per-position acceptance over ``observations`` (drafts-weighted), as deep as the
    deepest of them and ``prior``; deeper positions keep ``prior``'s decay; rounded to
    ``ROUND`` and never rising with the position (an unconditional rate cannot)."""
    depth = max([len(prior), *(len(o.rates) for o in observations)])
    rates: list[float] = []
    for i in range(depth):
        weight = sum(o.drafts for o in observations if len(o.rates) > i)
        if weight:
            rate = sum(o.rates[i] * o.drafts for o in observations if len(o.rates) > i) / weight
        elif rates and i < len(prior) and prior[i - 1] > 0:
            rate = rates[-1] * prior[i] / prior[i - 1]
        else:
            rate = prior[i] if i < len(prior) else 0.0
        rate = min(max(rate, 0.0), rates[-1] if rates else 1.0)
        rates.append(rate)
    return tuple(round(round(rate / ROUND) * ROUND, 6) for rate in rates)


def mean_length(rates: Sequence[float]) -> float:
    """Mean accepted tokens per step (vLLM's mean acceptance length) at full depth."""
    return 1.0 + sum(rates)


def calibrated(oracle: SimOracle, rates: tuple[float, ...]) -> SimOracle:
    """``oracle`` predicting with ``rates`` as its MTP acceptance (its own constants kept)."""
    profile = oracle.calibration or CalibrationProfile(source="measured acceptance")
    constants = profile.constants.model_copy(update={"mtp_acceptance": rates})
    return replace(oracle, calibration=profile.model_copy(update={"constants": constants}))


class CalibratedCache(MutableMapping[str, Score | None]):
    """A view of a prediction cache whose keys are prefixed with the calibration's tag."""

    def __init__(self, base: PredictionCache, tag: str) -> None:
        self.base, self.prefix = base, f"{tag}|"

    def __getitem__(self, key: str) -> Score | None:
        return self.base[self.prefix + key]

    def __setitem__(self, key: str, value: Score | None) -> None:
        self.base[self.prefix + key] = value

    def __delitem__(self, key: str) -> None:
        del self.base[self.prefix + key]

    def __iter__(self) -> Iterator[str]:
        return (k[len(self.prefix) :] for k in list(self.base) if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.prefix + key in self.base


def tag(rates: Sequence[float]) -> str:
    return "mtp_acceptance=" + ",".join(f"{rate:.3f}" for rate in rates)


class Recalibration:
    """The acceptance measured so far, and the oracle and cache the guide now predicts with."""

    def __init__(self, oracle: SimOracle, cache: PredictionCache) -> None:
        self.base_oracle, self.base_cache = oracle, cache
        self.oracle: SimOracle = oracle
        self.cache: PredictionCache = cache
        self.prior = prior_acceptance(oracle)
        self.rates = self.prior  # what the guide's predictions were made with
        self.observations: dict[int, Observation] = {}  # by trial number
        self.repredicted = 0  # predictions made by every update
        self.updates = 0
        self.seconds = 0.0  # the last update's
        self.depth = 0  # the deepest measured position when the guide was last re-predicted
        self.affected = 0  # configs the last update re-ranked
        self._speculative: dict[str, bool] = {}

    def observe(self, trial: int, stats: ServerStats | None) -> None:
        found = observation(stats)
        if found is not None:
            self.observations[trial] = found

    def estimate(self) -> tuple[float, ...] | None:
        """The pooled acceptance, None before a measured MTP trial (or without MTP)."""
        if not self.observations or not self.prior:
            return None
        return pooled(list(self.observations.values()), self.prior)

    def update(self, guide: Guide, maximize: bool) -> bool:
        """Re-predict the guide's MTP configs when the estimate moved (the module
        docstring); whether it did."""
        estimate = self.estimate()
        if estimate is None:
            return False
        moved = mean_length(estimate) / mean_length(self.rates) - 1.0
        depth = max(len(o.rates) for o in self.observations.values())
        deeper = depth > self.depth and self.updates > 0 and estimate != self.rates
        if abs(moved) <= THRESHOLD and not deeper:
            return False
        started = time.monotonic()
        self.rates, self.updates, self.depth = estimate, self.updates + 1, depth
        self.oracle = calibrated(self.base_oracle, estimate)
        self.cache = CalibratedCache(self.base_cache, tag(estimate))
        affected = [
            i for i, candidate in enumerate(guide.candidates) if self._is_speculative(candidate)
        ]
        tiers = predict_two_tier(
            self.oracle, [guide.candidates[i] for i in affected], self.cache, maximize=maximize
        )
        self.repredicted += tiers.replayed
        self.affected = len(affected)
        guide.oracle, guide.cache = self.oracle, self.cache  # what ``settle`` replays with now
        guide.repredict(
            affected, tiers.scores, maximize, screened=list(tiers.screened), alike=tiers.alike
        )
        self.seconds = time.monotonic() - started
        return True

    def _is_speculative(self, candidate: Candidate) -> bool:
        if candidate.key not in self._speculative:
            sim = self.base_oracle.sim_config(candidate.config)
            self._speculative[candidate.key] = sim is not None and sim.num_speculative_tokens > 0
        return self._speculative[candidate.key]

    def describe(self) -> str:
        """One line: the estimate against what the simulator assumed."""
        rates = "/".join(f"{rate:.2f}" for rate in self.rates)
        prior = "/".join(f"{rate:.2f}" for rate in self.prior)
        return (
            f"recalibrated: MTP acceptance per draft position {rates} (measured over "
            f"{len(self.observations)} trials; the simulator assumed {prior}); "
            f"{self.affected:,} MTP configs re-screened, {self.repredicted:,} replayed, in "
            f"{self.seconds:.1f} s"
        )
