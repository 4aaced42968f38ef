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
SHORTLIST_MIN = 8  # ... and never fewer configs than this
SLO_SLACK = 0.5  # a screened SLO shortfall (value / limit - 1) the short list still takes


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
    """Screen ``configs`` (TrialConfigs, ``keys`` their cache keys), replay the best
    ``shortlist`` of those ``cache`` lacks into it, and return every config's score:
    the cache's replay where it has one, else the screen's. ``deadline``
    (``time.monotonic()``) is the replays' safety stop."""
    missing = [i for i, key in enumerate(keys) if key not in cache]
    screened_scores = oracle.screen([configs[i] for i in missing]) if missing else []
    by_index = dict(zip(missing, screened_scores, strict=True))
    order = screen_rank(screened_scores, maximize)[:shortlist]
    judged = [missing[int(j)] for j in order]
    replayed = 0
    results = predict_iter(oracle, [configs[i] for i in judged], deadline=deadline)
    try:
        for index, scored in zip(judged, results, strict=False):
            cache[keys[index]] = scored
            replayed += 1
    finally:
        results.close()
    scores: list[Score | None] = []
    screened = np.zeros(len(keys), dtype=bool)
    for index, key in enumerate(keys):
        if key in cache:
            scores.append(cache[key])
        else:
            scores.append(by_index[index])
            screened[index] = True
    return TwoTier(scores, screened, replayed, len(judged) - replayed)


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
