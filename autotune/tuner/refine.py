"""Off-lattice refinement: a pattern search on the simulator around the predicted best.

The lattice (autotune.tuner.lattice) visits a few values of each numeric knob
(powers of two of max-num-seqs and max-num-batched-tokens, every other KV
step); the best config can lie between them. ``refine`` starts from the top
``STARTS`` predicted lattice configs (one of each predicted behaviour), moves
one numeric knob at a time by a step that halves when no move improves the
prediction (compass search), and stops when every step is below the knob's
resolution or after ``MAX_PREDICTIONS`` simulator runs. A point is a trial's
config: snapped to the knob's grid, within its bounds and the space's rules,
derived flags applied, passed by the memory pre-screen, deduplicated as a
launch. Every point predicted at least as good as the weakest start joins the
guide, where the warm start and the sampler rank it with the lattice.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from autotune.space import SearchSpace
from autotune.trial import Prescreen, derive_config
from autotune.tuner.guide import SAME_PREDICTION, Guide, PredictionCache, utility_of
from autotune.tuner.lattice import Candidate, config_key, ladder
from autotune.tuner.predictor import SimOracle, predict_all

STARTS = 3  # predicted-best lattice configs refined (twins with one prediction count once)
MAX_PREDICTIONS = 36  # simulator runs for the whole refinement
MIN_RELATIVE_STEP = 0.02  # a log-scaled knob is not refined finer than 2% of its value


@dataclass
class Refinement:
    """What ``refine`` added, and what it cost."""

    guide: Guide  # the lattice's candidates and the refined ones
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
        low, high = self.dist.low, self.dist.high
        if high == low:
            return 0.0
        if self.dist.log:
            return math.log(value / low) / math.log(high / low)
        return (value - low) / (high - low)

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
        """The smallest step worth taking from ``value``, in unit coordinates."""
        finest = 0.0
        if self.grid is not None and self.dist.high > self.dist.low:
            finest = abs(self.unit(min(self.dist.high, value + self.grid)) - self.unit(value))
        if self.dist.log and self.dist.high > self.dist.low:
            finest = max(
                finest, math.log1p(MIN_RELATIVE_STEP) / math.log(self.dist.high / self.dist.low)
            )
        return finest


class _Search:
    """Shared state of one refinement: the points seen, their predictions, the budget."""

    def __init__(
        self,
        space: SearchSpace,
        guide: Guide,
        *,
        model: str,
        engine_version: str | None,
        prescreen: Prescreen | None,
        oracle: SimOracle,
        maximize: bool,
        cache: PredictionCache,
    ) -> None:
        self.space, self.model, self.engine_version = space, model, engine_version
        self.prescreen, self.oracle, self.maximize, self.cache = prescreen, oracle, maximize, cache
        self.utility: dict[str, float] = {
            c.key: float(u) for c, u in zip(guide.candidates, guide.utility, strict=True)
        }
        self.new: dict[str, Candidate] = {}
        self.by_params: dict[str, str | None] = {}  # params -> launch key (None: not launchable)
        self.predictions = 0

    def candidate(self, params: dict[str, Any]) -> Candidate | None:
        """The launch ``params`` makes, if the rules and the pre-screen allow it."""
        if self.space.rule_violations(params):
            return None
        config = derive_config(
            self.space,
            params,
            model=self.model,
            engine_version=self.engine_version,
            prescreen=self.prescreen,
        )
        memory = self.prescreen(config) if self.prescreen is not None else None
        if memory is not None and not memory.fits:
            return None
        return Candidate(params=params, config=config, key=config_key(config), memory=memory)

    def evaluate(self, points: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
        """Predicted utility of each launchable point (NaN: predicted infeasible)."""
        fresh: list[Candidate] = []
        keyed: list[tuple[dict[str, Any], str]] = []
        for params in points:
            tag = repr(sorted(params.items()))
            if tag not in self.by_params:
                found = self.candidate(params)
                self.by_params[tag] = found.key if found else None
                if found and found.key not in self.utility and found.key not in self.new:
                    if found.key not in self.cache:
                        fresh.append(found)
                    self.new[found.key] = found
            key = self.by_params[tag]
            if key is not None:
                keyed.append((params, key))
        fresh = fresh[: max(0, MAX_PREDICTIONS - self.predictions)]
        for candidate, scored in zip(
            fresh, predict_all(self.oracle, [c.config for c in fresh]), strict=True
        ):
            self.cache[candidate.key] = scored
        self.predictions += len(fresh)
        for key in list(self.new):
            if key not in self.utility and key in self.cache:
                scored = self.cache[key]
                feasible = scored is not None and scored.feasible and scored.values
                self.utility[key] = (
                    utility_of(scored.values[0], self.maximize) if feasible else math.nan
                )
            elif key not in self.utility:
                del self.new[key]  # over the budget: not predicted
        return [(params, self.utility[key]) for params, key in keyed if key in self.utility]

    def climb(self, start: Candidate, knobs: list[_Knob]) -> None:
        """Compass search from ``start`` (see the module docstring)."""
        here, best = dict(start.params), self.utility[start.key]
        steps = {knob.name: knob.first_step for knob in knobs}
        while self.predictions < MAX_PREDICTIONS:
            points = []
            for knob in knobs:
                for sign in (1, -1):
                    moved = knob.value(knob.unit(here[knob.name]) + sign * steps[knob.name])
                    if moved != here[knob.name]:
                        points.append({**here, knob.name: moved})
            if not points:
                return
            scored = [(p, u) for p, u in self.evaluate(points) if np.isfinite(u)]
            top = max(scored, key=lambda pair: pair[1], default=None)
            if top is not None and top[1] > best:
                here, best = top
                continue
            for knob in knobs:
                steps[knob.name] /= 2
            knobs = [k for k in knobs if steps[k.name] >= k.resolution(here[k.name])]
            if not knobs:
                return


def refine(
    guide: Guide,
    space: SearchSpace,
    *,
    model: str,
    engine_version: str | None,
    prescreen: Prescreen | None,
    oracle: SimOracle,
    maximize: bool,
    cache: PredictionCache | None = None,
) -> Refinement:
    """The guide with refined off-lattice candidates added (see the module docstring)."""
    started = time.monotonic()
    cache = {} if cache is None else cache
    knobs = [
        _Knob(name, dist)
        for name, dist in space.distributions(engine_version).items()
        if not isinstance(dist, optuna.distributions.CategoricalDistribution)
        and dist.high > dist.low
    ]
    search = _Search(
        space,
        guide,
        model=model,
        engine_version=engine_version,
        prescreen=prescreen,
        oracle=oracle,
        maximize=maximize,
        cache=cache,
    )
    starts = _starts(guide)
    for start in starts:
        search.climb(start, knobs)
    floor = min((search.utility[s.key] for s in starts), default=math.inf)
    added = [c for key, c in search.new.items() if search.utility.get(key, -math.inf) >= floor]
    lattice_best = float(np.nanmax(guide.utility)) if guide.predicted else math.nan
    refined_best = max((search.utility[c.key] for c in added), default=lattice_best)
    extended = Guide(
        candidates=[*guide.candidates, *added],
        utility=np.concatenate([guide.utility, [search.utility[c.key] for c in added]]),
        coords=np.vstack([guide.coords, *[guide.encode(c.params) for c in added]])
        if added
        else guide.coords,
        encode=guide.encode,
        seconds=guide.seconds + time.monotonic() - started,
    )
    return Refinement(
        guide=extended,
        added=len(added),
        predictions=search.predictions,
        seconds=time.monotonic() - started,
        gain=math.exp(max(0.0, refined_best - lattice_best)) if guide.predicted else 1.0,
    )


def _starts(guide: Guide) -> list[Candidate]:
    """The ``STARTS`` best predicted lattice configs, one of each predicted value (KV
    dtype twins that the simulator cannot tell apart are refined once)."""
    order = np.argsort(-np.nan_to_num(guide.utility, nan=-np.inf))
    picked: list[int] = []
    for i in order:
        if len(picked) == STARTS or not np.isfinite(guide.utility[i]):
            break
        if all(abs(guide.utility[i] - guide.utility[j]) >= SAME_PREDICTION for j in picked):
            picked.append(int(i))
    return [guide.candidates[i] for i in picked]
