"""Two tiers of prediction: the screen scores every config, the replay judges the best.

The replay (``sim/virtual/predict.py``) costs tens of milliseconds a config; the screen
(``sim/virtual/screen/``) well under one. ``predict_two_tier`` screens the configs the
cache has no replay of, then the replay judges, into the cache:

- the short list: the screen's best ``SHORTLIST_SHARE`` of the lattice counted in
  distinct predictions, at least ``SHORTLIST_MIN``: of configs the screen predicts
  exactly alike (a KV pool that never fills, at every size) the replay judges the one
  the screen ranks first, and the others take its figures until they are replayed;
- the memory edges (``lattice``: the largest prefill chunk that fits beside a row's
  lattice points), every one the screen predicts to run: where memory is tight the
  screen is near-blind (its rank correlation 0.08 on such a card), and there a chunk past
  a lattice point can cross into another regime (a 24 GB card with 8 Claude Code
  sessions: 2.5 GiB of fp8 KV with MTP 2 and max-num-seqs 2 screened at 20 tok/s,
  replayed at 39.7 from 1,632 batched tokens on). Replaying only the edges whose KV pool
  can bind cost the tuner launches on a large card (docs/benchmarks.md): every one stays;
- the climb: the lattice neighbours (one step along one knob) of the replay's best
  ``CLIMB_STARTS`` distinct predictions and of any other within ``CLIMB_WITHIN`` of the
  best, again while they change, at most as many configs as the short list took
  (``CLIMB_MIN`` at least). The screen's error is a ranking error near the top (configs a
  percent apart); the climb settles it by replay where the screen put its winner one
  step off.

A config only screened keeps the screen's score, marked as such: the guide replays it
before anything launches it or crowns a seed with it (``Guide.settle``). The screen is a
ranking with an error band, so the short list takes a config whose screened latencies
miss an SLO by less than ``SLO_SLACK`` (``ttft_p95`` of 24 s against a 20-s limit, say):
the replay decides. ``scripts/bench_screen.py`` measures that the replay's best over a
whole lattice is among the configs the two tiers replay, and what the two tiers cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.trial.objective import Score
from autotune.tuner.lattice import Candidate, lattice_neighbours
from autotune.tuner.predictor import SimOracle, predict_iter

SHORTLIST_SHARE = 0.02  # of the lattice, in distinct screen predictions
SHORTLIST_MIN = 16  # ... and never fewer
CLIMB_STARTS = 3  # the climb starts from the replay's best distinct predictions, this many
CLIMB_WITHIN = 0.05  # ... and every other within this of the best
CLIMB_MIN = 16  # configs the climb may add, at least (else as many as the short list took)
SLO_SLACK = 0.5  # a screened SLO shortfall (value / limit - 1) the short list still takes


@dataclass
class TwoTier:
    """Scores of a list of configs: replayed where ``screened`` is False."""

    scores: list[Score | None]
    screened: np.ndarray  # True: the screen's score only
    replayed: int  # configs the replay judged now (the cache's not counted)
    stopped: int  # configs left to the screen by the safety stop
    shortlisted: int  # distinct screen predictions the short list took
    climbed: int  # configs the climb added
    edges: int = 0  # memory edges judged beside the short list
    # Per config, its screen prediction's id (configs the screen predicts alike share one;
    # -1: none): a replay of one speaks for the others until they are replayed.
    alike: np.ndarray | None = None


def shortlist_size(count: int) -> int:
    """How many distinct screen predictions of ``count`` configs the short list takes."""
    return min(count, max(SHORTLIST_MIN, math.ceil(SHORTLIST_SHARE * count)))


def screen_rank(scores: Sequence[Score | None], maximize: bool) -> np.ndarray:
    """Indices of ``scores`` best first by the screen: the configs it predicts to run
    (no OOM, no crash, SLOs within the slack) by value, then the rest."""
    return np.argsort(-_rank_values(scores, maximize), kind="stable")


def _rank_values(scores: Sequence[Score | None], maximize: bool) -> np.ndarray:
    value = np.full(len(scores), -np.inf)
    for index, scored in enumerate(scores):
        if scored is None or not scored.values:
            continue
        runs = all(
            margin <= (SLO_SLACK if key.startswith("slo:") else 0.0)
            for key, margin in scored.constraints.items()
        )
        if runs:
            log_value = math.log(max(scored.values[0], 1e-9))
            value[index] = log_value if maximize else -log_value
    return value


def shortlist(scores: Sequence[Score | None], maximize: bool, size: int) -> list[list[int]]:
    """The screen's best ``size`` distinct predictions, best first: each the configs it
    predicts alike, best first by the screen's ranking. Where fewer run within the
    slack, the nearest to every limit fill the rest (the least shortfall first): what a
    load no config serves (a plan's one replica for a whole team) is tuned for."""
    values = _rank_values(scores, maximize)
    ranked = np.argsort(-values, kind="stable")[: int(np.isfinite(values).sum())]
    shortfall = _shortfalls(scores)
    shortfall[np.isfinite(values)] = np.inf
    nearest = np.argsort(shortfall, kind="stable")[: int(np.isfinite(shortfall).sum())]
    groups: dict[tuple, list[int]] = {}
    for index in [*ranked, *nearest]:
        alike = _prediction(scores[index])
        if alike not in groups:
            if len(groups) == size:
                break
            groups[alike] = []
        groups[alike].append(int(index))
    return list(groups.values())


def _shortfalls(scores: Sequence[Score | None]) -> np.ndarray:
    """Each config's largest constraint margin (an SLO missed by 40%: 0.4) where the
    screen predicts it to serve; infinite where it predicts no figures (OOM, a crash)."""
    return np.array(
        [
            max(s.constraints.values(), default=0.0) if s is not None and s.values else np.inf
            for s in scores
        ],
        dtype=float,
    )


def _prediction(scored: Score | None) -> tuple:
    """What the screen predicted of a config, apart from its memory margin."""
    if scored is None:
        return ()
    slos = sorted(
        (key, round(margin, 9))
        for key, margin in scored.constraints.items()
        if key.startswith("slo:")
    )
    return (tuple(round(v, 9) for v in scored.values or ()), tuple(slos), scored.feasible)


def predict_two_tier(
    oracle: SimOracle,
    candidates: Sequence[Candidate],
    cache: MutableMapping[str, Score | None],
    *,
    maximize: bool,
    shortlist_configs: int | None = None,
    deadline: float | None = None,
) -> TwoTier:
    """Screen ``candidates``, judge the short list and the climb by replay into ``cache``
    (those it lacks), and return every config's score: the cache's replay where it has
    one, else the screen's. ``shortlist_configs`` caps the short list's distinct
    predictions (None: ``shortlist_size``); ``deadline`` (``time.monotonic()``) is the
    replays' safety stop."""
    keys = [c.key for c in candidates]
    missing = [i for i, key in enumerate(keys) if key not in cache]
    screened_scores: list[Score | None] = (
        oracle.screen([c.config for c in candidates]) if missing else [None] * len(keys)
    )
    size = shortlist_size(len(keys)) if shortlist_configs is None else shortlist_configs
    judging = _Judge(oracle, candidates, cache, deadline)
    groups = shortlist(screened_scores, maximize, size) if missing else []
    judging.judge(group[0] for group in groups)  # the others are predicted alike
    edges = _edges(candidates, screened_scores, maximize) if missing else []
    judging.judge(edges)
    budget = max(len(groups), CLIMB_MIN)
    climbed = _climb(judging, candidates, maximize, budget=budget) if missing else 0
    # A config the screen predicts as it does a replayed one takes that replay's figures,
    # still marked as screened (``Guide.settle`` replays it before it is launched).
    stand_in = {
        member: keys[group[0]]
        for group in groups
        for member in group[1:]
        if keys[group[0]] in cache
    }
    scores: list[Score | None] = []
    screened = np.zeros(len(keys), dtype=bool)
    for index, key in enumerate(keys):
        if key in cache:
            scores.append(cache[key])
            continue
        screened[index] = True
        scores.append(cache[stand_in[index]] if index in stand_in else screened_scores[index])
    return TwoTier(
        scores,
        screened,
        judging.replayed,
        judging.stopped,
        len(groups),
        climbed,
        len(edges),
        alike_ids(screened_scores),
    )


def alike_ids(scores: Sequence[Score | None]) -> np.ndarray:
    """Per config, an id shared by the configs the screen predicts alike (-1 where it
    predicts no figures)."""
    ids: dict[tuple, int] = {}
    return np.array(
        [
            ids.setdefault(_prediction(s), len(ids)) if s is not None and s.values else -1
            for s in scores
        ],
        dtype=np.int64,
    )


def _edges(
    candidates: Sequence[Candidate], scores: Sequence[Score | None], maximize: bool
) -> list[int]:
    """The memory edges the replay judges: every one the screen predicts to run."""
    edges = [i for i, c in enumerate(candidates) if c.edge]
    values = _rank_values([scores[i] for i in edges], maximize)
    return [edges[i] for i in np.argsort(-values, kind="stable") if np.isfinite(values[i])]


def _climb(judging: _Judge, candidates: Sequence[Candidate], maximize: bool, budget: int) -> int:
    """Judge the neighbours of the replay's best configs until the best ones have none
    left unjudged, or ``budget`` configs were added; returns how many were."""
    neighbours = lattice_neighbours([c.params for c in candidates])
    added = 0
    while added < budget and not judging.stopped:
        best = judging.best(maximize)
        fresh = sorted({j for i in best for j in neighbours[i]} - judging.judged)
        if not fresh:
            break
        fresh = fresh[: budget - added]
        judging.judge(fresh)
        added += len(fresh)
    return added


class _Judge:
    """The replay's verdicts on candidates, kept in the cache."""

    def __init__(
        self,
        oracle: SimOracle,
        candidates: Sequence[Candidate],
        cache: MutableMapping[str, Score | None],
        deadline: float | None,
    ) -> None:
        self.oracle, self.candidates = oracle, candidates
        self.cache, self.deadline = cache, deadline
        # The configs judged on this path (the cache may hold more: the path is the same
        # whatever it holds, so a second run replays nothing the first did not).
        self.judged: set[int] = set()
        self.replayed = self.stopped = 0

    def judge(self, indices: Iterable[int]) -> None:
        indices = list(indices)
        wanted = [i for i in indices if self.candidates[i].key not in self.cache]
        found = predict_iter(
            self.oracle, [self.candidates[i].config for i in wanted], deadline=self.deadline
        )
        done = 0
        try:
            for index, scored in zip(wanted, found, strict=False):
                self.cache[self.candidates[index].key] = scored
                done += 1
        finally:
            found.close()
        self.judged.update(i for i in indices if self.candidates[i].key in self.cache)
        self.replayed += done
        self.stopped += len(wanted) - done

    def best(self, maximize: bool) -> list[int]:
        """The judged configs to climb from: the replay's best ``CLIMB_STARTS`` distinct
        predictions (twins count once) and any other within ``CLIMB_WITHIN`` of the best."""
        judged = sorted(self.judged)
        scores = [self.cache[self.candidates[i].key] for i in judged]
        values = _rank_values(scores, maximize)
        picked: list[int] = []
        seen: set[tuple] = set()
        for position in np.argsort(-values, kind="stable"):
            if not np.isfinite(values[position]):
                break
            alike = _prediction(scores[position])
            near = values[position] >= values.max() + math.log(1 - CLIMB_WITHIN)
            if alike not in seen and (len(seen) < CLIMB_STARTS or near):
                seen.add(alike)
                picked.append(judged[position])
        return picked


def judge(
    oracle: SimOracle,
    configs: Sequence,
    keys: Sequence[str],
    cache: MutableMapping[str, Score | None],
) -> list[Score | None]:
    """Replay ``configs`` into ``cache`` (those it lacks) and return their replays."""
    missing = [i for i, key in enumerate(keys) if key not in cache]
    for i, scored in zip(missing, predict_iter(oracle, [configs[i] for i in missing]), strict=True):
        cache[keys[i]] = scored
    return [cache[key] for key in keys]
