"""Two tiers of prediction: the screen scores every config, the replay judges the best.

The replay (``sim/virtual/predict.py``) costs tens of milliseconds a config; the
screen (``sim/virtual/screen.py``) well under one. ``predict_two_tier`` screens every
config the cache has no replay of, replays the short list the screen ranks at the top
(``SHORTLIST_SHARE`` of the configs, at least ``SHORTLIST_MIN``) and keeps the
replays in the cache. A config only screened keeps its screen score, marked as such:
the guide replays it before anything launches it or crowns a seed with it
(``Guide.settle``). The screen is a ranking with an error band, so the short list
takes a config whose screened latencies miss an SLO by less than ``SLO_SLACK``
(``ttft_p95`` of 24 s against a 20-s limit, say): the replay decides.
``scripts/bench_screen.py`` measures that the replay's best over a whole lattice is
inside the short list.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.config.trial_config import TrialConfig
from autotune.trial.objective import Score
from autotune.tuner.predictor import SimOracle, predict_iter

SHORTLIST_SHARE = 0.02  # the replay judges this share of the lattice up front
SHORTLIST_MIN = 64  # ... and never fewer (a small lattice affords it: ~2 s of replays)
SLO_SLACK = 0.5  # a screened SLO shortfall (value / limit - 1) the short list still takes
# The screen is trusted where the short list's replays bear it out; elsewhere (a card whose
# KV pool the long sessions overflow, where preemption sets the pace) the list doubles
# until they do, or the replay has judged the whole lattice.
MAX_FAILED = 0.5  # of a short list, at most this share fails or misses a limit on replay
MAX_ERROR = 0.15  # median |log(replay / screen)| over the short list's configs that run


@dataclass
class TwoTier:
    """Scores of a list of configs: replayed where ``screened`` is False."""

    scores: list[Score | None]
    screened: np.ndarray  # True: the screen's score only
    replayed: int  # replays made (the cache's not counted)
    stopped: int  # short-listed configs left to the screen by the safety stop


def shortlist_size(count: int) -> int:
    """How many of ``count`` configs the replay judges up front."""
    return min(count, max(SHORTLIST_MIN, math.ceil(SHORTLIST_SHARE * count)))


def screen_rank(scores: Sequence[Score | None], maximize: bool) -> np.ndarray:
    """Indices of ``scores`` best first by the screen: the configs it predicts to run
    (no OOM, no crash, SLOs within the slack) by value, then the rest."""
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
    return np.argsort(-value, kind="stable")


def predict_two_tier(
    oracle: SimOracle,
    configs: Sequence[TrialConfig],
    keys: Sequence[str],
    cache: MutableMapping[str, Score | None],
    *,
    maximize: bool,
    shortlist: int,
    deadline: float | None = None,
) -> TwoTier:
    """Screen ``configs`` (TrialConfigs, ``keys`` their cache keys), replay those of its
    best ``shortlist`` that ``cache`` lacks into it, and return every config's score:
    the cache's replay where it has one, else the screen's. ``deadline``
    (``time.monotonic()``) is the replays' safety stop."""
    missing = [i for i, key in enumerate(keys) if key not in cache]
    screened_scores = oracle.screen(configs) if missing else []
    # The short list is the screen's top over every config (so that a second run, whose
    # cache holds the first's replays, replays nothing); the replay judges those it lacks.
    ranked = [int(i) for i in screen_rank(screened_scores, maximize)] if missing else []
    replayed = stopped = 0
    taken = 0
    while taken < len(ranked):
        size = shortlist if taken == 0 else taken  # the list doubles while not trusted
        batch, taken = ranked[taken : taken + size], taken + size
        judged = [i for i in batch if keys[i] not in cache]
        results = predict_iter(oracle, [configs[i] for i in judged], deadline=deadline)
        done = 0
        try:
            for index, scored in zip(judged, results, strict=False):
                cache[keys[index]] = scored
                done += 1
        finally:
            results.close()
        replayed, stopped = replayed + done, stopped + len(judged) - done
        if stopped or trusted(
            [screened_scores[i] for i in ranked[:taken]],
            [cache.get(keys[i]) for i in ranked[:taken]],
        ):
            break
    scores: list[Score | None] = []
    screened = np.zeros(len(keys), dtype=bool)
    for index, key in enumerate(keys):
        if key in cache:
            scores.append(cache[key])
        else:
            scores.append(screened_scores[index])
            screened[index] = True
    return TwoTier(scores, screened, replayed, stopped)


def trusted(screened: Sequence[Score | None], replayed: Sequence[Score | None]) -> bool:
    """Whether the replays of a short list bear the screen out: of the configs the screen
    put there, the replay runs most (no more than ``MAX_FAILED`` fail or miss a limit) and
    its values are within ``MAX_ERROR`` of the screen's (median of the log ratio)."""
    runs = [r is not None and r.feasible for r in replayed]
    if sum(runs) < (1 - MAX_FAILED) * len(replayed):
        return False
    errors = [
        abs(math.log(max(r.values[0], 1e-9) / max(s.values[0], 1e-9)))
        for s, r, ok in zip(screened, replayed, runs, strict=True)
        if ok and s is not None and s.values and r is not None and r.values
    ]
    return bool(errors) and float(np.median(errors)) <= MAX_ERROR


def judge(
    oracle: SimOracle,
    configs: Sequence[TrialConfig],
    keys: Sequence[str],
    cache: MutableMapping[str, Score | None],
) -> list[Score | None]:
    """Replay ``configs`` into ``cache`` (those it lacks) and return their replays."""
    missing = [i for i, key in enumerate(keys) if key not in cache]
    for i, scored in zip(missing, predict_iter(oracle, [configs[i] for i in missing]), strict=True):
        cache[keys[i]] = scored
    return [cache[key] for key in keys]
