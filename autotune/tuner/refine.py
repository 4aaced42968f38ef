"""Off-lattice refinement: a pattern search on the simulator around the best estimates.

The lattice (autotune.tuner.lattice) visits a few values of each numeric knob
(powers of two of max-num-seqs and max-num-batched-tokens, every other KV
step); the best config can lie between them. ``Refiner.refine`` starts from the
``STARTS`` best candidates of the guide by the simulator's prediction plus the
learned residual's mean (one of each estimated value), moves one numeric knob at
a time by a step that halves when no move improves that estimate (compass
search), and stops when every step is below the knob's resolution or after
``PREDICTIONS`` new simulator runs. A point is a trial's config: snapped to the
knob's grid, within its bounds and the space's rules, derived flags applied,
passed by the memory pre-screen, deduplicated as a launch. Where a climb ends
more than ``SAME_PREDICTION`` above its start, off the guide, that config joins
the guide, where the sampler ranks it with the lattice. The tuner refines after
each new measurement, not before the first: refined by the prediction alone,
the warm start seeded configs the simulator prefers by under 1% that are truly
worse (docs/measurements/history.md).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from autotune.config.space import SearchSpace
from autotune.trial.run import Prescreen, derive_config
from autotune.tuner.backoff import MemoryBackoff
from autotune.tuner.guide import (
    SAME_PREDICTION,
    Guide,
    PredictionCache,
    unit_position,
    utility_of,
)
from autotune.tuner.lattice import Candidate, config_key, ladder
from autotune.tuner.predictor import SimOracle, predict_all
from autotune.tuner.residual import ResidualModel

STARTS = 3  # best candidates refined (twins with one prediction count once)
PREDICTIONS = 12  # points off the guide one refinement may estimate (at most as many runs)
MIN_RELATIVE_STEP = 0.02  # a log-scaled knob is not refined finer than 2% of its value


@dataclass
class Refinement:
    """What ``refine`` added, and what it cost."""

    added: int  # refined candidates (off the lattice)
    predictions: int  # simulator runs spent (cached launches cost none)
    seconds: float
    gain: float  # how much better the best refined point is predicted than the lattice's (1.0: not)


class _Knob:
    """One numeric parameter in unit coordinates (log-scaled where the space is)."""

    def __init__(self, name: str, dist: Any) -> None:
        self.name, self.dist = name, dist
        self.is_int = isinstance(dist, optuna.distributions.IntDistribution)
        self.grid = dist.step if dist.step is not None else (1 if self.is_int else None)
        values = ladder(dist)
        gaps = [self.unit(b) - self.unit(a) for a, b in itertools.pairwise(values)]
        self.first_step = max(gaps, default=0.0) / 2  # half the lattice's spacing

    def unit(self, value: float) -> float:
        return unit_position(self.dist, value)

    def value(self, unit: float) -> Any:
        low, high = self.dist.low, self.dist.high
        unit = min(1.0, max(0.0, unit))
        raw = low * (high / low) ** unit if self.dist.log else low + unit * (high - low)
        return self.snap(raw)

    def snap(self, raw: float) -> Any:
        low, high = self.dist.low, self.dist.high
        if self.grid is not None:
            raw = low + round((raw - low) / self.grid) * self.grid
        raw = min(high, max(low, raw))
        return round(raw) if self.is_int else round(raw, 9)

    def resolution(self, value: float) -> float:
        """The smallest step worth taking from ``value``, in unit coordinates (> 0): one
        grid step, and for a log-scaled knob at least ``MIN_RELATIVE_STEP`` of the value."""
        low, high = self.dist.low, self.dist.high
        if self.dist.log:
            relative = max(MIN_RELATIVE_STEP, (self.grid or 0) / value)
            return math.log1p(relative) / math.log(high / low)
        return (self.grid or MIN_RELATIVE_STEP * (high - low)) / (high - low)


class Refiner:
    """The refinements of one run: the points seen and their predictions are kept."""

    def __init__(
        self,
        space: SearchSpace,
        *,
        model: str,
        engine_version: str | None,
        prescreen: Prescreen | None,
        oracle: SimOracle,
        maximize: bool,
        cache: PredictionCache | None = None,
        backoff: MemoryBackoff | None = None,
    ) -> None:
        self.space, self.model, self.engine_version = space, model, engine_version
        self.backoff = backoff or MemoryBackoff()  # what OOM launches ruled out
        self.prescreen, self.oracle, self.maximize = prescreen, oracle, maximize
        self.cache: PredictionCache = {} if cache is None else cache
        self.knobs = [
            _Knob(name, dist)
            for name, dist in space.distributions(engine_version).items()
            if not isinstance(dist, optuna.distributions.CategoricalDistribution)
            and dist.high > dist.low
        ]
        self._launch: dict[str, Candidate | None] = {}  # params -> launch (None: not allowed)
        self.predictions = 0  # simulator runs of every refinement so far

    def use(self, oracle: SimOracle, cache: PredictionCache) -> None:
        """Predict with ``oracle`` from now on (a recalibrated simulator), into ``cache``."""
        self.oracle, self.cache = oracle, cache

    def refine(
        self,
        guide: Guide,
        residual: ResidualModel | None = None,
        *,
        budget: int = PREDICTIONS,
    ) -> Refinement:
        """Climb from the guide's best (by prediction, plus ``residual``'s mean when given)
        and add where the climbs end to ``guide`` (see the module docstring); ``gain``:
        the best estimate after over before."""
        started, spent = time.monotonic(), self.predictions
        self._charged: set[str] = set()  # points off the guide estimated in this call
        correction = np.zeros(len(guide.candidates))
        if residual is not None and len(guide.candidates):
            correction = residual.predict(guide.coords)[0]
        ranked = guide.utility + correction
        ends: dict[str, Candidate] = {}
        for start in _starts(guide, ranked):
            end, gain = self._climb(guide, residual, start, budget)
            if gain > SAME_PREDICTION and end.key not in guide.by_key:
                ends[end.key] = end
        added = list(ends.values())
        best = float(np.nanmax(ranked)) if guide.predicted else math.nan
        guide.extend(
            added,
            [self.cache[c.key] for c in added],
            [self._utility(c.key) for c in added],
        )
        if added and np.isfinite(best):
            correction = residual.predict(guide.coords)[0] if residual is not None else 0
            gain = math.exp(max(0.0, float(np.nanmax(guide.utility + correction)) - best))
        else:
            gain = 1.0
        return Refinement(
            added=len(added),
            predictions=self.predictions - spent,
            seconds=time.monotonic() - started,
            gain=gain,
        )

    def predicted(self, candidate: Candidate) -> float:
        """The simulator's predicted utility of a launch (NaN: predicted not to run or to
        miss a constraint); predicted once, then read from the cache."""
        if candidate.key not in self.cache:
            self.cache[candidate.key] = predict_all(self.oracle, [candidate.config])[0]
            self.predictions += 1
        return self._utility(candidate.key)

    def _utility(self, key: str) -> float:
        scored = self.cache.get(key)
        if scored is None or not scored.feasible or not scored.values:
            return math.nan
        return utility_of(scored.values[0], self.maximize)

    def candidate(self, params: dict[str, Any]) -> Candidate | None:
        """The launch ``params`` makes, if the rules and the pre-screen allow it."""
        tag = repr(sorted(params.items()))
        if tag not in self._launch:
            found = None
            if not self.space.rule_violations(params):
                config = derive_config(
                    self.space,
                    params,
                    model=self.model,
                    engine_version=self.engine_version,
                    prescreen=self.prescreen,
                )
                memory = self.prescreen(config) if self.prescreen is not None else None
                if memory is None or memory.fits:
                    found = Candidate(params, config, config_key(config), memory)
            self._launch[tag] = found
        return self._launch[tag]

    def proposable(self, params: dict[str, Any]) -> Candidate | None:
        """``candidate``, unless an OOM launch showed it past the memory's edge
        (``tuner.backoff``)."""
        found = self.candidate(params)
        return None if found is None or self.backoff.presumes_oom(found.memory) else found

    def _estimate(
        self, guide: Guide, residual: ResidualModel | None, points: list[Candidate], limit: int
    ) -> list[float]:
        """The estimate of each point (NaN: predicted infeasible, or over the budget). Each
        point off the guide counts against ``limit``, predicted now or cached, so that a
        refinement goes the same way whatever an earlier run left in the cache."""
        allowed: dict[str, Candidate] = {}
        for c in points:
            if c.key in guide.by_key:
                continue
            if c.key in self._charged or len(self._charged) < limit:
                self._charged.add(c.key)
                allowed[c.key] = c
        fresh = [c for key, c in allowed.items() if key not in self.cache]
        for candidate, scored in zip(
            fresh, predict_all(self.oracle, [c.config for c in fresh]), strict=True
        ):
            self.cache[candidate.key] = scored
        self.predictions += len(fresh)
        utility = np.array(
            [
                guide.utility[guide.by_key[c.key]]
                if c.key in guide.by_key
                else self._utility(c.key)
                if c.key in allowed
                else math.nan
                for c in points
            ]
        )
        if residual is not None and points:
            utility = (
                utility + residual.predict(np.array([guide.encode(c.params) for c in points]))[0]
            )
        return list(utility)

    def _climb(
        self, guide: Guide, residual: ResidualModel | None, start: Candidate, limit: int
    ) -> tuple[Candidate, float]:
        """Compass search from ``start``: where it ends, and how much better it is."""
        here = start
        best = first = self._estimate(guide, residual, [start], limit)[0]
        steps = {knob.name: knob.first_step for knob in self.knobs}
        knobs = list(self.knobs)
        while knobs and len(self._charged) < limit:
            points = []
            for knob in knobs:
                now = here.params[knob.name]
                for sign in (1, -1):
                    moved = knob.value(knob.unit(now) + sign * steps[knob.name])
                    found = self.proposable({**here.params, knob.name: moved})
                    if moved != now and found is not None:
                        points.append(found)
            estimates = self._estimate(guide, residual, points, limit)
            top = max(
                (pair for pair in zip(estimates, points, strict=True) if np.isfinite(pair[0])),
                key=lambda pair: pair[0],
                default=None,
            )
            if top is not None and top[0] > best:
                best, here = top
                continue
            for knob in knobs:
                steps[knob.name] /= 2
            knobs = [k for k in knobs if steps[k.name] >= k.resolution(here.params[k.name])]
        return here, best - first


def _starts(guide: Guide, ranked: np.ndarray) -> list[Candidate]:
    """The ``STARTS`` best candidates by ``ranked``, one of each value (KV dtype twins
    that the simulator cannot tell apart are refined once)."""
    order = np.argsort(-np.nan_to_num(ranked, nan=-np.inf))
    picked: list[int] = []
    for i in order:
        if len(picked) == STARTS or not np.isfinite(ranked[i]):
            break
        if all(abs(ranked[i] - ranked[j]) >= SAME_PREDICTION for j in picked):
            picked.append(int(i))
    return [guide.candidates[i] for i in picked]
