"""Warm start: every effective config predicted once, in two tiers, then ranked.

``build_guide`` enumerates the lattice (autotune.tuner.lattice), drops what the memory
pre-screen rejects and predicts the rest (``two_tier``: the screen scores every config,
the replay judges the screen's short list and its neighbours; a cache keyed by the
launch keeps repeat runs free). The sampler and the warm-start seeds read the predicted
objective of each. When too few configs are predicted feasible (an SLO out of reach on
this GPU and traffic), the ones predicted to run come next, nearest to feasible first:
least ``shortfall``, the largest predicted constraint margin (e.g. p95 TTFT / limit - 1).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

from autotune.config.space import SearchSpace
from autotune.trial.objective import Score
from autotune.trial.run import Prescreen
from autotune.tuner.backoff import MemoryBackoff
from autotune.tuner.lattice import Candidate, enumerate_effective
from autotune.tuner.predictor import SimOracle
from autotune.tuner.two_tier import judge, predict_two_tier, shortlist_size

MIN_SEED_DISTANCE = 0.25  # warm-start seeds differ by at least this (one categorical = 1)
# Two configs predicted within this (log) of each other and closer than EQUIVALENT_DISTANCE
# are taken as the same behaviour (e.g. max-num-seqs above the load's concurrency):
# one of them is enough to launch.
SAME_PREDICTION = 0.002
EQUIVALENT_DISTANCE = 0.75
# Seeds one categorical apart that the simulator predicts exactly alike are twins (fp8_e4m3
# and fp8_e5m2: the same bytes and speed): a second one would launch a known answer.
TWIN_DISTANCE = 1.0 + 1e-9
TIED_PREDICTION = 1e-9

PredictionCache = MutableMapping[str, Score | None]
# Enumerations of this process, by space, model, engine version and pre-screen: a
# benchmark runs many studies of one space; a run enumerates once.
_ENUMERATIONS: dict[tuple, list[Candidate]] = {}


@dataclass
class Guide:
    """The lattice's candidates with their predicted utility (log value; higher is better)."""

    candidates: list[Candidate]
    utility: np.ndarray  # NaN where predicted infeasible or not predictable
    coords: np.ndarray  # one row per candidate (see ``encode``)
    encode: Any  # params -> coordinate row
    # The prediction of each candidate (None: predicted to OOM or crash, or not predicted).
    scores: list[Score | None] | None = None
    seconds: float = 0.0  # time spent enumerating and predicting
    cached: int = 0  # replays the cache already held (not made by this run)
    stopped: int = 0  # configs the safety stop left to the screen's score
    budget_s: float | None = None  # the replays' safety stop in wall seconds (None: none)
    # True where the score is the screen's only (``two_tier``): ``settle`` replays it first.
    screened: np.ndarray | None = None
    # The screen's prediction of each candidate as an id (``two_tier.alike_ids``; -1: none):
    # a screened candidate takes the replay of one the screen predicts alike (``settle``).
    alike: np.ndarray | None = None
    oracle: SimOracle | None = None  # what ``settle`` replays with
    cache: PredictionCache | None = None  # ... and where it keeps the replays
    maximize: bool = True
    replayed_now: int = 0  # replays this run made (the cache's not counted)
    by_key: dict[str, int] = field(default_factory=dict)
    backoff: MemoryBackoff = field(default_factory=MemoryBackoff)  # learned from OOM launches
    shortfall: np.ndarray = field(init=False)  # NaN where not predicted to run at all

    def __post_init__(self) -> None:
        self.by_key = {candidate.key: index for index, candidate in enumerate(self.candidates)}
        known = np.zeros(0, dtype=bool) if self.screened is None else self.screened
        extra = np.zeros(len(self.candidates) - len(known), dtype=bool)  # off-lattice: replayed
        self.screened = np.concatenate([known, extra])
        ids = np.zeros(0, dtype=np.int64) if self.alike is None else self.alike
        self.alike = np.concatenate([ids, np.full(len(self.candidates) - len(ids), -1)])
        scores = self.scores or [None] * len(self.candidates)
        self.shortfall = np.array(
            [
                max(s.constraints.values(), default=0.0) if s is not None and s.values else np.nan
                for s in scores
            ],
            dtype=float,
        )

    def extend(
        self, candidates: list[Candidate], scores: list[Score | None], utility: list[float]
    ) -> None:
        """Add candidates off the lattice with their predictions (``autotune.tuner.refine``)."""
        self.scores = [*(self.scores or [None] * len(self.candidates)), *scores]
        self.candidates = [*self.candidates, *candidates]
        self.utility = np.concatenate([self.utility, utility])
        self.coords = np.vstack([self.coords, *[self.encode(c.params) for c in candidates]])
        self.__post_init__()

    def settle(self, indices: list[int]) -> bool:
        """Replay the candidates at ``indices`` that only the screen scored (before one is
        launched or seeds the study); whether any was. The others the screen predicts
        alike take each one's replay, still marked screened: a config at an SLO's edge the
        screen put on the right side moves with its twins, not one replay at a time."""
        assert self.screened is not None and self.alike is not None
        pending = [i for i in indices if self.screened[i]]
        if not pending or self.oracle is None:
            return False
        cache = {} if self.cache is None else self.cache
        self.replayed_now += sum(self.candidates[i].key not in cache for i in pending)
        found = judge(
            self.oracle,
            [self.candidates[i].config for i in pending],
            [self.candidates[i].key for i in pending],
            cache,
        )
        replayed = {int(self.alike[i]): scored for i, scored in zip(pending, found, strict=True)}
        replayed.pop(-1, None)
        twins = np.flatnonzero(self.screened & np.isin(self.alike, list(replayed)))
        twins = [int(j) for j in twins if j not in pending]
        self.repredict(
            [*pending, *twins],
            [*found, *(replayed[int(self.alike[j])] for j in twins)],
            self.maximize,
            screened=[False] * len(pending) + [True] * len(twins),
        )
        return True

    def repredict(
        self,
        indices: list[int],
        scores: list[Score | None],
        maximize: bool,
        *,
        screened: bool | Sequence[bool] = False,
        alike: np.ndarray | None = None,
    ) -> None:
        """Replace the predictions of the candidates at ``indices`` (a recalibrated
        simulator's: ``autotune.tuner.acceptance``; ``screened``: the screen's only;
        ``alike``: their new screen predictions' ids, ``two_tier.alike_ids``)."""
        self.scores = list(self.scores or [None] * len(self.candidates))
        assert self.screened is not None and self.alike is not None
        if alike is not None:  # ids of their own, apart from those the others hold
            fresh = int(self.alike.max(initial=-1)) + 1
            self.alike[indices] = np.where(alike >= 0, alike + fresh, -1)
        flags = [screened] * len(indices) if isinstance(screened, bool) else list(screened)
        for index, scored, flag in zip(indices, scores, flags, strict=True):
            self.scores[index] = scored
            self.screened[index] = flag
            feasible = scored is not None and scored.feasible and scored.values
            self.utility[index] = utility_of(scored.values[0], maximize) if feasible else np.nan
        self.__post_init__()

    @property
    def predicted(self) -> int:
        """Candidates predicted to meet every constraint."""
        return int(np.isfinite(self.utility).sum())

    @property
    def replayed(self) -> int:
        """Candidates the replay predicted (the rest have the screen's score only)."""
        assert self.screened is not None
        return int((~self.screened).sum())

    @property
    def presumed_oom(self) -> np.ndarray:
        """Mask of the candidates an OOM launch showed to be past the memory's edge
        (``tuner.backoff``): their predictions stand, but none is proposed."""
        if self.backoff.floor is None:  # no OOM launch yet: the usual case
            return np.zeros(len(self.candidates), dtype=bool)
        return self.backoff.presumed([c.memory for c in self.candidates])

    def ruled_out(self, keys: set[str]) -> np.ndarray:
        """Mask of the candidates not to propose: one of ``keys`` or alike one
        (``equivalent_to``), or presumed to OOM."""
        return self.equivalent_to(keys) | self.presumed_oom

    def nearest(self) -> np.ndarray:
        """Indices of the candidates predicted to run but to miss a constraint, least
        shortfall first (predicted OOM, presumed OOM and unpredicted ones are not among
        them)."""
        runs = np.isfinite(self.shortfall) & ~self.presumed_oom
        infeasible = np.flatnonzero(~np.isfinite(self.utility) & runs)
        return infeasible[np.argsort(self.shortfall[infeasible], kind="stable")]

    def diverse_top(self, count: int, *, exclude: set[str] = frozenset()) -> list[Candidate]:
        """The ``count`` best predicted candidates, each far enough from the ones before;
        when fewer are predicted feasible, the nearest to feasible fill the rest. Each is
        replayed first where only the screen scored it (``settle``), and the pick made
        again until every one was replayed."""
        while True:
            picked = self._diverse_top(count, exclude)
            if not self.settle([self.by_key[c.key] for c in picked]):
                return picked

    def _diverse_top(self, count: int, exclude: set[str]) -> list[Candidate]:
        best = [i for i in np.argsort(-np.nan_to_num(self.utility, nan=-np.inf))]
        presumed_oom = self.presumed_oom
        best = [i for i in best if np.isfinite(self.utility[i]) and not presumed_oom[i]]
        order = [i for i in [*best, *self.nearest()] if self.candidates[i].key not in exclude]
        picked: list[int] = []
        for i in order:
            if len(picked) == count:
                break
            if not any(self._redundant(i, j) for j in picked):
                picked.append(i)
        return [self.candidates[i] for i in picked]

    def _redundant(self, i: int, j: int) -> bool:
        distance = float(np.linalg.norm(self.coords[i] - self.coords[j]))
        if distance < MIN_SEED_DISTANCE:
            return True
        if np.isfinite(self.utility[i]) != np.isfinite(self.utility[j]):
            return False
        rank = self.utility if np.isfinite(self.utility[i]) else self.shortfall
        gap = abs(rank[i] - rank[j])
        twins = gap < TIED_PREDICTION and distance < TWIN_DISTANCE
        return bool(twins or (gap < SAME_PREDICTION and distance < EQUIVALENT_DISTANCE))

    def equivalent_to(self, keys: set[str]) -> np.ndarray:
        """Mask of candidates that are one of ``keys`` or behave like one as far as the
        simulator can tell (the same prediction, near in the space; or twins: the exact
        same prediction one categorical apart)."""
        mask = np.array([c.key in keys for c in self.candidates], dtype=bool)
        for j in (self.by_key[key] for key in keys if key in self.by_key):
            # A feasible one by its predicted value, one that misses an SLO by its shortfall.
            rank = self.utility if np.isfinite(self.utility[j]) else self.shortfall
            if not np.isfinite(rank[j]):
                continue
            distance = np.linalg.norm(self.coords - self.coords[j], axis=1)
            gap = np.abs(rank - rank[j])
            twins = (gap < TIED_PREDICTION) & (distance < TWIN_DISTANCE)
            same = (gap < SAME_PREDICTION) & (distance < EQUIVALENT_DISTANCE)
            alike = np.isfinite(self.utility) == np.isfinite(self.utility[j])
            mask |= (same | twins) & alike
        return mask


def utility_of(value: float, maximize: bool) -> float:
    """Log value, sign-flipped when minimising: ratios become differences."""
    safe = max(value, 1e-9)
    return math.log(safe) if maximize else -math.log(safe)


def make_encoder(space: SearchSpace, engine_version: str | None) -> Any:
    """params -> coordinates: numeric parameters by their position on the ladder (0..1,
    log-scaled where the space is), categoricals one-hot so that any change is distance 1."""
    distributions = space.distributions(engine_version)

    def encode(params: dict[str, Any]) -> np.ndarray:
        row: list[float] = []
        for name, dist in distributions.items():
            value = params.get(name)
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                row += [(1.0 if value == choice else 0.0) / math.sqrt(2) for choice in dist.choices]
            else:
                row.append(unit_position(dist, value))
        return np.array(row)

    return encode


def unit_position(dist: Any, value: float) -> float:
    """Where ``value`` lies between a numeric distribution's bounds, 0..1 (log-scaled
    where the distribution is)."""
    if dist.high == dist.low:
        return 0.0
    if dist.log:
        return math.log(value / dist.low) / math.log(dist.high / dist.low)
    return (value - dist.low) / (dist.high - dist.low)


def build_guide(
    space: SearchSpace,
    *,
    model: str,
    engine_version: str | None,
    prescreen: Prescreen | None,
    oracle: SimOracle,
    maximize: bool,
    cache: PredictionCache | None = None,
    budget_s: float | None = None,
    shortlist: int | None = None,
    say: Callable[[str], None] | None = None,
) -> Guide:
    """Enumerate, pre-screen and predict the lattice (see the module docstring); ``say``
    hears the phase. ``shortlist``: the distinct screen predictions the replay's short
    list takes at most (None: ``two_tier.shortlist_size``), a count, so that the machine's
    speed cannot change what is replayed; ``budget_s`` seconds is a safety stop for the
    replays that keeps what it has (the rest keep the screen's scores)."""
    started = time.monotonic()
    memo_key = (space.digest(), model, engine_version, id(prescreen))
    if memo_key not in _ENUMERATIONS:
        _ENUMERATIONS[memo_key] = [
            c
            for c in enumerate_effective(
                space, model=model, engine_version=engine_version, prescreen=prescreen
            )
            if c.memory is None or c.memory.fits
        ]
    candidates = _ENUMERATIONS[memo_key]
    cache = {} if cache is None else cache
    say = say or (lambda _: None)
    held = sum(c.key in cache for c in candidates)
    size = shortlist_size(len(candidates)) if shortlist is None else shortlist
    if held < len(candidates):
        say(
            f"Warm start: screening {len(candidates):,} configs, the replay judging the best "
            f"{size:,} distinct predictions and their neighbours"
            + (f" ({held:,} replays from the prediction cache)" if held else "")
            + " ..."
        )
    deadline = None if budget_s is None else started + budget_s
    tiers = predict_two_tier(
        oracle, candidates, cache, maximize=maximize, shortlist_configs=size, deadline=deadline
    )
    if tiers.replayed or tiers.stopped:
        said = (
            f"Warm start: screened {len(candidates):,} configs, replayed {tiers.replayed:,} "
            f"(the short list's {tiers.shortlisted:,} distinct predictions, {tiers.edges:,} "
            f"memory edges, {tiers.climbed:,} neighbours) in {time.monotonic() - started:.1f} s"
        )
        if tiers.stopped:
            said += (
                f"; stopped by the {budget_s:g}-s safety stop (warm_start_budget_s), the other "
                f"{tiers.stopped:,} keep the screen's scores"
            )
        say(said)
    utility = np.full(len(candidates), np.nan)
    scores = tiers.scores
    for index, scored in enumerate(scores):
        if scored is not None and scored.feasible and scored.values:
            utility[index] = utility_of(scored.values[0], maximize)
    encode = make_encoder(space, engine_version)
    coords = np.array([encode(c.params) for c in candidates]) if candidates else np.zeros((0, 0))
    return Guide(
        candidates=candidates,
        utility=utility,
        coords=coords,
        encode=encode,
        scores=scores,
        seconds=time.monotonic() - started,
        cached=held,
        stopped=tiers.stopped,
        budget_s=budget_s,
        screened=tiers.screened,
        alike=tiers.alike,
        oracle=oracle,
        cache=cache,
        maximize=maximize,
        replayed_now=tiers.replayed,
    )
