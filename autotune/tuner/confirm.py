"""Noise: re-measure the best candidates, then crown the config the evidence favours.

A config's belief is a normal posterior over its utility: its measurements (mean
utility, run-to-run noise ``MEASUREMENT_SD`` each) combined, by precision, with
what the simulator plus the learned residual says about it (the prior; without a
guide, or with ``prior`` off, the measurements alone). A neighbour the local search
launched has its centre's measurements as its prior instead, whatever ``prior`` says:
it was launched as "like its centre, give or take ``NEIGHBOUR_SD``", and one lucky
run of one of many neighbours must not take the crown. The crowned config is the
best posterior mean among configs that never failed. Re-measurements go where
they are worth most: ``race`` picks the config whose next measurement most raises
the expected true value of the crown (the knowledge gradient of ranking and
selection); ``duel`` is the older rule (leader against its closest challenger).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from autotune.tuner.drift import fit
from autotune.tuner.measured import MEASUREMENT_SD, Measured, MeasuredIndex
from autotune.tuner.residual import NOISE_SD
from autotune.tuner.sampler import GuidedSampler

# How far a neighbour off the lattice may differ from its measured centre in ways the
# simulator cannot tell (log scale): the prior of a neighbour's belief, centred on its
# centre's measurements (``tuner.local``).
NEIGHBOUR_SD = 0.03
DUEL_Z = 2.0  # a challenger further behind than this many noise units is not worth a launch
# Configs whose measured means are this close (log scale, 0.1%) always tie: the figures
# print alike and no run resolves them (one run's noise is ~3%). A noiseless simulator
# gives configs that behave alike such figures (the quick start: max-num-seqs 8 and 64
# serve 94.4197 and 94.4205 tok/s for a peak of 6 running).
TIE_FLOOR = 1e-3
# A config within this many standard errors of the leader (by the noise the study's
# re-measurements show) ties with it: the measurements cannot tell which is better (under
# 70% sure), so the one that needs least is crowned (``resource_order``).
TIE_Z = 0.5
# Two runs of one config this many noise units apart: one of them is odd (noise alone
# parts two runs this far about once in 2,000 pairs).
DISPUTE_SD = 4.0
DISPUTE_REACH = 2.0  # ... and its better run this many noise units from the leader or closer
# The crown goes to the best lower bound, this many standard deviations of a config's
# belief below its mean: a config one run lifted stands 3% below its run, one measured
# ten times 1% below its mean, so a single lucky run does not outrank repeated runs.
CROWN_Z = 1.0
# A config tied with the crown's leader takes the crown for needing less only when it was
# measured as often as the leader, up to this many runs: one run within the noise of a
# config measured often is not evidence that the two are alike.
TIE_RUNS = 2


@dataclass(frozen=True)
class Belief:
    """Posterior of one config's utility (log scale)."""

    mean: float
    var: float

    def gain(self, best_other: float, *, crownable: bool = True) -> float:
        """Expected rise of the best posterior mean if this config is measured once more
        (``best_other``: the best posterior mean among the other configs; see
        ``knowledge_gradient`` for ``crownable``)."""
        mean, var = np.array([self.mean]), np.array([self.var])
        return float(knowledge_gradient(mean, var, best_other, crownable=crownable)[0])


def knowledge_gradient(
    mean: np.ndarray, var: np.ndarray, best_other: float, *, crownable: bool = True
) -> np.ndarray:
    """Expected rise of the best posterior mean from one more measurement of each config
    (posterior ``mean`` / ``var``; ``best_other``: the best mean among the others). An
    unmeasured config is not ``crownable`` before it is measured: then its gain is all
    that its measurement may put above ``best_other``."""
    after = 1 / (1 / np.maximum(var, 1e-12) + 1 / MEASUREMENT_SD**2)
    change = np.sqrt(np.maximum(var - after, 1e-12))  # sd of the coming shift of the mean
    gap = mean - best_other
    z = (gap if not crownable else -np.abs(gap)) / change
    return change * (z * ndtr(z) + np.exp(-z * z / 2) / math.sqrt(2 * math.pi))


def beliefs(
    index: MeasuredIndex,
    *,
    maximize: bool,
    sampler: GuidedSampler | None = None,
    prior: bool = True,
) -> dict[str, Belief]:
    """The belief about every feasible measured config."""
    known = None
    if prior and sampler is not None and sampler.learn:
        mean, spread = sampler.estimates()
        known = (sampler.guide.by_key, mean, spread)
    levels = fit(index, maximize=maximize)
    result: dict[str, Belief] = {}
    for entry in index.by_key.values():
        if entry.key not in levels.level:
            continue
        precision = levels.weight[entry.key] / MEASUREMENT_SD**2
        weighted = precision * levels.level[entry.key]
        centre = index.by_trial.get(entry.centre) if entry.centre is not None else None
        if centre is not None and centre.key in levels.level:
            prior_var = MEASUREMENT_SD**2 / levels.weight[centre.key] + NEIGHBOUR_SD**2
            precision += 1 / prior_var
            weighted += levels.level[centre.key] / prior_var
        elif known is not None and entry.key in known[0]:
            at = known[0][entry.key]
            if math.isfinite(known[1][at]):
                prior_var = known[2][at] ** 2 + NOISE_SD**2
                precision += 1 / prior_var
                weighted += known[1][at] / prior_var
        result[entry.key] = Belief(weighted / precision, 1 / precision)
    return result


def estimates(
    index: MeasuredIndex,
    *,
    maximize: bool,
    sampler: GuidedSampler | None = None,
    prior: bool = True,
) -> dict[str, float]:
    """Estimated utility (posterior mean) of every feasible measured config."""
    found = beliefs(index, maximize=maximize, sampler=sampler, prior=prior)
    return {key: belief.mean for key, belief in found.items()}


def ranked(
    index: MeasuredIndex,
    *,
    maximize: bool,
    sampler: GuidedSampler | None = None,
    prior: bool = True,
) -> list[Measured]:
    """Feasible measured configs, best estimate first."""
    scores = estimates(index, maximize=maximize, sampler=sampler, prior=prior)
    return sorted((index.by_key[key] for key in scores), key=lambda e: -scores[e.key])


def confirmation_targets(
    index: MeasuredIndex,
    count: int,
    *,
    maximize: bool,
    sampler: GuidedSampler | None = None,
    prior: bool = True,
) -> list[Measured]:
    """The ``count`` best configs by estimate: each is measured once more."""
    return ranked(index, maximize=maximize, sampler=sampler, prior=prior)[:count]


def race(
    index: MeasuredIndex,
    *,
    maximize: bool,
    sampler: GuidedSampler | None = None,
    prior: bool = True,
) -> Measured | None:
    """The config whose next measurement is worth most to the crown (see the module
    docstring); None when nothing feasible was measured."""
    found = beliefs(index, maximize=maximize, sampler=sampler, prior=prior)
    if not found:
        return None
    order = sorted(found, key=lambda key: -found[key].mean)
    if len(order) == 1:
        return index.by_key[order[0]]

    def gain(key: str) -> float:
        best_other = found[order[1]].mean if key == order[0] else found[order[0]].mean
        return found[key].gain(best_other)

    return index.by_key[max(order, key=gain)]


def disputed(index: MeasuredIndex, *, maximize: bool) -> Measured | None:
    """A config measured twice whose two runs disagree by more than ``DISPUTE_SD`` noise
    units (one of them odd, which one the two cannot tell) and whose better run is within
    ``DISPUTE_REACH`` noise units of the leader: a third run settles it (``drift.fit`` then
    weighs the odd one down). The best such, or None."""
    levels = fit(index, maximize=maximize)
    if not levels.level:
        return None
    leader = max(levels.level.values())
    found = [
        (max(runs), key)
        for key, runs in levels.runs.items()
        if len(runs) == 2
        and abs(runs[0] - runs[1]) > DISPUTE_SD * MEASUREMENT_SD
        and max(runs) >= leader - DISPUTE_REACH * MEASUREMENT_SD
        and not index.confirming[index.by_key[key].first_trial]
    ]
    return index.by_key[max(found)[1]] if found else None


def exploration_gain(
    index: MeasuredIndex, sampler: GuidedSampler, leader: float, *, maximize: bool
) -> float:
    """The most one launch of an unmeasured lattice config can be expected to raise the
    crown's value, by the simulator plus learned residual (``leader``: the crown's
    posterior mean); 0 when nothing is left to explore."""
    mean, spread = sampler.estimates()
    tried = sampler.guide.ruled_out(set(index.by_key) | index.pending)
    open_ = ~tried & np.isfinite(mean)
    if not open_.any():
        return 0.0
    var = spread[open_] ** 2 + NOISE_SD**2
    return float(knowledge_gradient(mean[open_], var, leader, crownable=False).max())


def duel(
    index: MeasuredIndex,
    *,
    maximize: bool,
    sampler: GuidedSampler | None = None,
    prior: bool = True,
    top: int = 5,
) -> Measured | None:
    """The config whose next measurement can most change the crown: of the leader and its
    closest challenger (smallest gap in units of their measurement noise), the one
    measured less often; None when nothing was measured or no challenger is within
    ``DUEL_Z`` noise units."""
    scores = estimates(index, maximize=maximize, sampler=sampler, prior=prior)
    best = sorted(scores, key=lambda key: -scores[key])[:top]
    if not best:
        return None
    leader = index.by_key[best[0]]

    def z(entry: Measured) -> float:
        noise = MEASUREMENT_SD * math.sqrt(1 / len(leader.samples) + 1 / len(entry.samples))
        return (scores[leader.key] - scores[entry.key]) / noise

    challengers = [index.by_key[key] for key in best[1:]]
    if not challengers:
        return leader if len(leader.samples) < 2 else None
    challenger = min(challengers, key=z)
    if z(challenger) > DUEL_Z:
        return None
    return leader if len(leader.samples) < len(challenger.samples) else challenger


def crown(
    index: MeasuredIndex,
    *,
    maximize: bool,
    sampler: GuidedSampler | None = None,
    prior: bool = True,
) -> Measured | None:
    """The config to hand over, or None when nothing feasible was measured: of the best
    lower bound and the configs tied with it, the one that needs least (``tie_group``)."""
    group = tie_group(index, maximize=maximize, sampler=sampler, prior=prior)
    return group[0] if group else None


def tie_group(
    index: MeasuredIndex,
    *,
    maximize: bool,
    sampler: GuidedSampler | None = None,
    prior: bool = True,
) -> list[Measured]:
    """The leader, the best lower bound (``CROWN_Z``), and the configs tied with it
    (``tied``) measured as often as it (up to ``TIE_RUNS``) or alike to ``TIE_FLOOR``, least
    needs first (``resource_order``); empty when nothing feasible was measured."""
    found = beliefs(index, maximize=maximize, sampler=sampler, prior=prior)
    if not found:
        return []
    order = sorted(found, key=lambda key: -lower_bound(found[key]))
    noise = fit(index, maximize=maximize).noise
    leader = found[order[0]]
    runs = min(TIE_RUNS, len(index.by_key[order[0]].samples))
    group = [
        key
        for key in tied(leader, {key: found[key] for key in order[1:]}, noise)
        if len(index.by_key[key].samples) >= runs or abs(leader.mean - found[key].mean) <= TIE_FLOOR
    ]
    return sorted((index.by_key[key] for key in [order[0], *group]), key=resource_order)


def lower_bound(belief: Belief) -> float:
    """What the crown ranks a config by: its belief's mean less ``CROWN_Z`` deviations."""
    return belief.mean - CROWN_Z * math.sqrt(belief.var)


def tied(leader: Belief, others: dict[str, Belief], noise: float) -> list[str]:
    """The keys of the ``others`` whose belief is within the study's measurement noise of
    the ``leader``'s: under ``TIE_Z`` standard errors of the difference, the noise being
    what the re-measured configs show (``observed_noise``, in place of ``MEASUREMENT_SD``),
    and at least ``TIE_FLOOR``. The same beliefs rank the configs: a neighbour's one lucky
    run, which its centre's measurements hold down, does not tie it with the leader."""
    scale = noise / MEASUREMENT_SD
    return [
        key
        for key, belief in others.items()
        if leader.mean - belief.mean
        <= max(TIE_FLOOR, TIE_Z * scale * math.sqrt(leader.var + belief.var))
    ]


def observed_noise(index: MeasuredIndex, *, maximize: bool) -> float:
    """Pooled spread of one measurement about its config's level (log scale; drift and
    odd runs seen through, ``drift.fit``) over the feasible configs measured more than
    once; 0 when none was."""
    return fit(index, maximize=maximize).noise


def resource_order(entry: Measured) -> tuple:
    """What a config needs, to compare tied configs (least first; docs/tuner.md): its
    max-num-seqs, its largest CUDA-graph capture size, its KV memory, its MTP draft
    tokens, LMCache, its max-num-batched-tokens; a flag left to the engine's default
    counts as the most. Its launch key last, so that the order is total."""
    flags = _flags(entry.key)
    compilation = flags.get("compilation-config") or {}
    captures = compilation.get("cudagraph_capture_sizes") if isinstance(compilation, dict) else None
    capture = 0 if flags.get("enforce-eager") is True else max(captures or [math.inf])
    speculative = flags.get("speculative-config") or {}
    return (
        _number(flags.get("max-num-seqs")),
        capture,
        _number(flags.get("kv-cache-memory-bytes")),
        _number(flags.get("gpu-memory-utilization")),
        int(speculative.get("num_speculative_tokens", 0)) if speculative else 0,
        flags.get("kv-transfer-config") is not None,
        _number(flags.get("max-num-batched-tokens")),
        entry.key,
    )


def _flags(key: str) -> dict:
    """The launch flags in a config's key (``lattice.config_key``); none in a key made
    otherwise (a test's name)."""
    try:
        found = json.loads(key)
    except json.JSONDecodeError:
        return {}
    return found[1] if isinstance(found, list) and len(found) == 2 else {}


def _number(value: object) -> float:
    """A numeric flag's value, a size with a suffix too (``7G``, as vLLM reads it); unset
    (the engine's default) or unreadable sorts last."""
    if isinstance(value, bool) or value is None:
        return math.inf
    if isinstance(value, int | float):
        return float(value)
    found = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)i?b?\s*", str(value), re.IGNORECASE)
    if found is None:
        return math.inf
    try:
        number = float(found[1])
    except ValueError:
        return math.inf
    return number * 1024 ** ("kmgt".find(found[2].lower()) + 1) if found[2] else number
