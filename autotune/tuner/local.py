"""Measured local search: launch the measured leaders' neighbours off the lattice.

The simulator cannot tell some neighbouring configs apart that the truth does (on a
24 GB long-context case it predicts -0.15% from 1,024 to 1,214 batched tokens; the
truth gains 28%), so neither the lattice nor refinement on the simulator
(``tuner.refine``) finds them. In the racing tail, once the corrected simulator
predicts nothing above the leader, ``LocalSearch`` spends at most ``budget``
launches on a compass search judged by measurements (each launch only when it is
worth more to the crown than a re-measurement: ``Tuner._neighbour``): around each of the
``CENTRES`` best measured configs, one numeric knob at a time, a step of half the
lattice's spacing up and down (on the knob's grid, within its bounds, the space's
rules, the derived flags, the memory pre-screen and what OOM launches ruled out:
``tuner.backoff``). A step up past what fits, or past what the simulator predicts to
run, stops at the last value that does: the pre-screen's edge, where larger batches gain
on long prompts; a step up of another knob that does not fit lowers the prefill chunk
(batched tokens) until it does (``_retreat``: on the harsh long-context truth,
max-num-seqs 3 beside 2,048 tokens is past the back-off's edge, beside 1,900 it runs 6%
above the lattice's optimum). The
next launch is the untried neighbour along the knob launched least often so far, the
simulator's best-rated among those: every knob gets a launch before the
simulator's favourite gets a second (on the harsh long-context truth the simulator rated
three batched-tokens steps, truly flat, above max-num-seqs 3, truly 6% better). Around
the leader, once every neighbour at the current step is measured and none took the
lead, the steps halve, down to the knob's resolution. A neighbour leads only by the
crown's evidence: its measurements, with its centre's as a prior
(``confirm.NEIGHBOUR_SD``), so one lucky run counts half; the search waits while the
leader has a single run, so racing re-measures a neighbour that leads before the
search moves on from it. A measured effective config, a pending one and a config alike
a measured one (``_answered``) are never proposed; a step of the KV pool's size is never
alike (on README adverse, 10 to 10.5 GiB at max-num-seqs 6 was predicted alike and is
truly 0.8% better: whether a pool fills is what the simulator's speed and memory decide).
A step of another knob onto a plateau, predicted alike its centre (max-num-seqs above the
load's concurrency), goes on to the first value predicted more than ``PLATEAU`` from it: where
the plateau ends, the one value along it a launch can learn from (``_past_plateau``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from autotune.tuner.lattice import Candidate
from autotune.tuner.measured import Measured, MeasuredIndex
from autotune.tuner.refine import Refiner

CENTRES = 4  # measured configs searched around: the leader and the next best by mean
BISECTIONS = 10  # halvings that find the last allowed value of a step past the edge
# Predicted within 0.01%: the same behaviour (the 24 GB case's gain hides in 0.15%).
ALIKE = 1e-4
PLATEAU = 0.002  # a plateau ends where a value is predicted over 0.2% from its centre
CHUNK = "max_num_batched_tokens"  # the knob a step up may lower to fit (``_retreat``)
# Flags of the KV pool's size. A step along one is never a known answer (``_answered``):
# whether a pool fills (and how many prefixes it keeps) depends on how fast the engine
# truly runs and on its memory, which the simulator's "alike" cannot vouch for.
KV_POOL_FLAGS = frozenset({"kv-cache-memory-bytes", "gpu-memory-utilization"})


class LocalSearch:
    """The measured compass search of one run (see the module docstring)."""

    def __init__(self, points: Refiner, budget: int) -> None:
        self.points = points  # launches and their predictions (rules, pre-screen, cache)
        self.budget = budget
        self.spent = 0
        self._steps: dict[str, dict[str, float]] = {}  # centre key -> knob -> unit step
        self._tried: dict[str, int] = {}  # knob -> launches taken along it

    def propose(
        self, index: MeasuredIndex, leader: Measured | None, ranked: list[Measured]
    ) -> tuple[Candidate, Measured] | None:
        """The next neighbour to launch and its centre, or None (budget spent, the leader
        measured once, or no untried neighbour left); ``take`` it to launch it."""
        if self.spent >= self.budget or leader is None or len(leader.samples) < 2:
            return None
        best: tuple[tuple[int, float], Candidate, Measured] | None = None
        for centre in ranked[:CENTRES]:
            for point in self._untried(centre, index, halve=centre.key == leader.key):
                knob = _moved(point, centre)
                rank = (-self._tried.get(knob, 0), self.points.predicted(point))
                if best is None or rank > best[0]:
                    best = (rank, point, centre)
        return None if best is None else (best[1], best[2])

    def take(self, point: Candidate, centre: Measured) -> dict[str, Any]:
        """Spend one launch of the budget on ``point`` (a proposal around ``centre``)."""
        self._steps.setdefault(point.key, dict(self._steps[centre.key]))
        knob = _moved(point, centre)
        self._tried[knob] = self._tried.get(knob, 0) + 1
        self.spent += 1
        return dict(point.params)

    def prior(self, point: Candidate, centre: Measured) -> tuple[float, float]:
        """What the simulator predicts ``point`` gains over ``centre`` (log scale; 0 when
        it cannot predict one of them), and that gain's variance: its square, as the
        simulator's difference between neighbours is as uncertain as it is large (the
        harsh long-context truth: max-num-seqs 3 predicted -5%, truly +6%)."""
        home = self.points.candidate(centre.params)
        if home is None:
            return 0.0, 0.0
        gain = self.points.predicted(point) - self.points.predicted(home)
        return (gain, gain**2) if math.isfinite(gain) else (0.0, 0.0)

    def _untried(self, centre: Measured, index: MeasuredIndex, *, halve: bool) -> list[Candidate]:
        """``centre``'s neighbours at its steps that nothing measured answers; around the
        leader (``halve``) the steps halve while every neighbour is measured."""
        steps = self._steps.setdefault(
            centre.key, {knob.name: knob.first_step for knob in self.points.knobs}
        )
        while steps:
            found = self._neighbours(centre, steps)
            untried = [c for c in found if not self._answered(c, index)]
            if untried or not halve:
                return untried
            for knob in self.points.knobs:
                if knob.name in steps:
                    steps[knob.name] /= 2
                    if steps[knob.name] < knob.resolution(centre.params[knob.name]):
                        del steps[knob.name]
        return []

    def _neighbours(self, centre: Measured, steps: dict[str, float]) -> list[Candidate]:
        found: dict[str, Candidate] = {}
        for knob in self.points.knobs:
            if knob.name not in steps:
                continue
            now = centre.params[knob.name]
            for sign in (1, -1):
                point = self._step(centre.params, knob, now, sign * steps[knob.name])
                if point is not None and point.key != centre.key:
                    found.setdefault(point.key, point)
        return list(found.values())

    def _step(self, params: dict[str, Any], knob: Any, now: Any, step: float) -> Candidate | None:
        """The launch one step from ``now`` along ``knob``; past what is allowed, the last
        allowed value towards it (bisection in the knob's unit coordinates)."""
        start, end = knob.unit(now), knob.unit(now) + step
        point = self._allowed({**params, knob.name: knob.value(end)})
        if point is not None and not self._sizes_kv_pool(knob.name):
            return self._past_plateau(params, knob, end, step, point)
        if point is not None or step < 0:
            return point
        inside, _ = self._bisect(params, knob, start, min(1.0, end), _exists)
        last = None if inside == start else self._allowed({**params, knob.name: knob.value(inside)})
        if last is None and knob.name != CHUNK:
            return self._retreat({**params, knob.name: knob.value(end)})
        return last

    def _past_plateau(
        self, params: dict[str, Any], knob: Any, end: float, step: float, point: Candidate
    ) -> Candidate:
        """``point`` (at ``end``), or, when the simulator predicts it alike its centre
        ``params`` (``ALIKE``: a known answer), the first allowed value further along
        ``knob`` predicted more than ``PLATEAU`` from it: where the plateau ends (bisection
        in the knob's unit coordinates). Above the load's concurrency max-num-seqs changes
        nothing the simulator sees; the one value a launch can learn from is where it starts
        to (README adverse: 64 down to 6, truly 3% better than 8 to 64, which the simulator
        predicts alike; 7 is 0.017% from 8 and served like it)."""
        home = self.points.candidate(params)
        if home is None:
            return point
        level = self.points.predicted(home)

        def flat(found: Candidate | None) -> bool:
            return found is not None and abs(self.points.predicted(found) - level) < PLATEAU

        if abs(self.points.predicted(point) - level) >= ALIKE:
            return point
        bound = 1.0 if step > 0 else 0.0
        if flat(self._allowed({**params, knob.name: knob.value(bound)})):
            return point  # flat to the knob's bound: nothing further to learn
        _, outside = self._bisect(params, knob, end, bound, flat)
        beyond = self._allowed({**params, knob.name: knob.value(outside)})
        return beyond if beyond is not None else point

    def _retreat(self, params: dict[str, Any]) -> Candidate | None:
        """``params`` with the prefill chunk (batched tokens) lowered to the largest value
        allowed, when ``params`` itself is not: a step up that pays for its memory with a
        smaller chunk (bisection in the chunk's unit coordinates)."""
        chunk = next((k for k in self.points.knobs if k.name == CHUNK), None)
        if chunk is None or CHUNK not in params:
            return None
        if self._allowed({**params, CHUNK: chunk.value(0.0)}) is None:
            return None
        inside, _ = self._bisect(params, chunk, 0.0, chunk.unit(params[CHUNK]), _exists)
        return self._allowed({**params, CHUNK: chunk.value(inside)})

    def _bisect(
        self,
        params: dict[str, Any],
        knob: Any,
        inside: float,
        outside: float,
        holds: Callable[[Candidate | None], bool],
    ) -> tuple[float, float]:
        """Where along ``knob`` (unit coordinates) ``holds`` stops holding of the allowed
        launch, from ``inside`` (it holds) towards ``outside`` (it does not): the last
        coordinate found where it holds and the first where it does not, ``BISECTIONS``
        halvings at most, down to the knob's grid."""
        for _ in range(BISECTIONS):
            middle = (inside + outside) / 2
            value = knob.value(middle)
            if value in (knob.value(inside), knob.value(outside)):
                break
            if holds(self._allowed({**params, knob.name: value})):
                inside = middle
            else:
                outside = middle
        return inside, outside

    def _allowed(self, params: dict[str, Any]) -> Candidate | None:
        """The launch, when the rules and the pre-screen allow it and the simulator
        predicts it runs (and no OOM launch ruled it out)."""
        point = self.points.proposable(params)
        if point is None or not math.isfinite(self.points.predicted(point)):
            return None
        return point

    def _answered(self, point: Candidate, index: MeasuredIndex) -> bool:
        """Measured, being measured, or alike a measured config: one parameter apart, not
        the KV pool's size, and predicted within ``ALIKE`` (a twin one categorical apart;
        max-num-seqs above the load's concurrency). Another run of the same behaviour under
        a new name would only give the crown one more noisy draw of it."""
        if point.key in index.by_key or point.key in index.pending:
            return True
        rating = self.points.predicted(point)
        for entry in index.by_key.values():
            names = entry.params.keys() | point.params.keys()
            moved = [n for n in names if entry.params.get(n) != point.params.get(n)]
            if len(moved) > 1 or (moved and self._sizes_kv_pool(moved[0])):
                continue
            other = self.points.candidate(entry.params)
            if other is not None and abs(self.points.predicted(other) - rating) < ALIKE:
                return True
        return False

    def _sizes_kv_pool(self, name: str) -> bool:
        """Whether parameter ``name`` sets the KV pool's size (``KV_POOL_FLAGS``)."""
        param = self.points.space.parameters.get(name)
        return getattr(param, "flag", None) in KV_POOL_FLAGS


def _exists(point: Candidate | None) -> bool:
    return point is not None


def _moved(point: Candidate, centre: Measured) -> str:
    """The parameter ``point`` moved from ``centre`` (a neighbour moves one)."""
    return next((n for n, v in point.params.items() if centre.params.get(n) != v), "")
