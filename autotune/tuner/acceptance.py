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
the refiner predicts with the calibrated oracle. The card's speed, fitted to the trials'
throughput and latencies (``tuner.speed``), rides in the same oracle: a fit taken
re-predicts every config, not only the MTP ones. Predictions under a calibration are
cached under a key that names it (``CalibratedCache``); rates are rounded to ``ROUND``,
so equal estimates share their predictions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass

from autotune.config.trial_config import TrialConfig
from autotune.replay.records import ReplayStats
from autotune.sim.virtual.predict import catalog_acceptance
from autotune.trial.objective import Score
from autotune.tuner.guide import Guide, PredictionCache
from autotune.tuner.lattice import Candidate
from autotune.tuner.predictor import SimOracle
from autotune.tuner.speed import NO_STEPS, SpeedFit, Steps, calibrated
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


def tag(rates: Sequence[float] | None, steps: Steps = NO_STEPS) -> str:
    """The cache key prefix of predictions made with ``rates`` and ``steps``."""
    parts = [] if rates is None else ["mtp_acceptance=" + ",".join(f"{r:.3f}" for r in rates)]
    if steps != NO_STEPS:
        parts.append("speed_steps=" + ",".join(str(step) for step in steps))
    return ";".join(parts)


class Recalibration:
    """The acceptance and speed measured so far, and the oracle and cache the guide now
    predicts with."""

    def __init__(self, oracle: SimOracle, cache: PredictionCache, *, speed: bool = True) -> None:
        self.base_oracle, self.base_cache = oracle, cache
        self.oracle: SimOracle = oracle
        self.cache: PredictionCache = cache
        self.prior = prior_acceptance(oracle)
        self.rates = self.prior  # what the guide's predictions were made with
        self.measured_rates: tuple[float, ...] | None = None  # ``rates``, once measured
        self.observations: dict[int, Observation] = {}  # by trial number
        self.speed = SpeedFit(oracle) if speed else None  # the card's speed (``tuner.speed``)
        self.steps = NO_STEPS  # the speed factors the guide's predictions were made with
        self.moved: list[str] = []  # what the last update moved: "acceptance", "speed"
        self.repredicted = 0  # predictions made by every update
        self.updates = 0
        self.seconds = 0.0  # the last update's
        self.depth = 0  # the deepest measured position when the guide was last re-predicted
        self.affected = 0  # configs the last update re-ranked
        self._speculative: dict[str, bool] = {}

    def observe(
        self,
        trial: int,
        stats: ServerStats | None,
        config: TrialConfig | None = None,
        replay: ReplayStats | None = None,
    ) -> None:
        """Take what a measured trial reported: its acceptance, and (with its launch and a
        replay that ran to the end) its speed."""
        found = observation(stats)
        if found is not None:
            self.observations[trial] = found
        if self.speed is not None and config is not None and replay is not None:
            self.speed.observe(trial, config, replay)

    def estimate(self) -> tuple[float, ...] | None:
        """The pooled acceptance, None before a measured MTP trial (or without MTP)."""
        if not self.observations or not self.prior:
            return None
        return pooled(list(self.observations.values()), self.prior)

    def update(self, guide: Guide, maximize: bool) -> bool:
        """Re-predict the guide when the acceptance estimate moved (its MTP configs) or
        the card's speed was fitted anew (every config); whether it did."""
        rates = self._moved_rates()
        steps = self.steps
        if self.speed is not None and self.speed.due():
            steps = self.speed.fit(rates)
        if rates == self.measured_rates and steps == self.steps:
            return False
        started = time.monotonic()
        accepted_moved, speed_moved = rates != self.measured_rates, steps != self.steps
        self.moved = [
            name
            for name, moved in (("acceptance", accepted_moved), ("speed", speed_moved))
            if moved
        ]
        self.updates += accepted_moved
        self.measured_rates, self.steps = rates, steps
        self.rates = rates or self.prior
        if rates is None and steps == NO_STEPS:  # back to the simulator as it was
            self.oracle, self.cache = self.base_oracle, self.base_cache
        else:
            self.oracle = calibrated(self.base_oracle, rates, steps)
            self.cache = CalibratedCache(self.base_cache, tag(rates, steps))
        affected = [
            i
            for i, candidate in enumerate(guide.candidates)
            if speed_moved or self._is_speculative(candidate)
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

    def _moved_rates(self) -> tuple[float, ...] | None:
        """The acceptance to predict with: the estimate once it moved the mean accepted
        length by more than ``THRESHOLD`` (or measured a position the last one
        extrapolated), else the one the guide predicts with (None: the oracle's own)."""
        estimate = self.estimate()
        if estimate is None:
            return self.measured_rates
        moved = mean_length(estimate) / mean_length(self.rates) - 1.0
        depth = max(len(o.rates) for o in self.observations.values())
        deeper = depth > self.depth and self.updates > 0 and estimate != self.rates
        if abs(moved) <= THRESHOLD and not deeper:
            return self.measured_rates
        self.depth = depth
        return estimate

    def _is_speculative(self, candidate: Candidate) -> bool:
        if candidate.key not in self._speculative:
            sim = self.base_oracle.sim_config(candidate.config)
            self._speculative[candidate.key] = sim is not None and sim.num_speculative_tokens > 0
        return self._speculative[candidate.key]

    def describe(self) -> str:
        """One line: what the last update moved, against what the simulator assumed."""
        said = []
        if "acceptance" in self.moved:
            rates = "/".join(f"{rate:.2f}" for rate in self.rates)
            prior = "/".join(f"{rate:.2f}" for rate in self.prior)
            said.append(
                f"MTP acceptance per draft position {rates} (measured over "
                f"{len(self.observations)} trials; the simulator assumed {prior})"
            )
        if "speed" in self.moved and self.speed is not None:
            said.append(self.speed.describe())
        return (
            f"recalibrated: {'; '.join(said)}; {self.affected:,} configs re-screened, "
            f"{self.repredicted:,} replayed, in {self.seconds:.1f} s"
        )
