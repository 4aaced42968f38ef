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
run, stops at the last value that does: the pre-screen's edge, where larger batches
gain on long prompts. The next launch is
the untried neighbour the simulator rates best. Around the leader, once every
neighbour at the current step is measured and none took the lead, the steps halve,
down to the knob's resolution. A neighbour leads only by the crown's evidence: its
measurements, with its centre's as a prior (``confirm.NEIGHBOUR_SD``), so one lucky
run counts half; the search waits while the leader has a single run, so racing
re-measures a neighbour that leads before the search moves on from it. A measured
effective config, a pending one and a config alike a measured one (``_answered``) are
never proposed.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.tuner.lattice import Candidate
from autotune.tuner.measured import Measured, MeasuredIndex
from autotune.tuner.refine import Refiner

CENTRES = 4  # measured configs searched around: the leader and the next best by mean
BISECTIONS = 10  # halvings that find the last allowed value of a step past the edge
# Predicted within 0.01%: the same behaviour (the 24 GB case's gain hides in 0.15%).
ALIKE = 1e-4


class LocalSearch:
    """The measured compass search of one run (see the module docstring)."""

    def __init__(self, points: Refiner, budget: int) -> None:
        self.points = points  # launches and their predictions (rules, pre-screen, cache)
        self.budget = budget
        self.spent = 0
        self._steps: dict[str, dict[str, float]] = {}  # centre key -> knob -> unit step

    def propose(
        self, index: MeasuredIndex, leader: Measured | None, ranked: list[Measured]
    ) -> tuple[Candidate, Measured] | None:
        """The next neighbour to launch and its centre, or None (budget spent, the leader
        measured once, or no untried neighbour left); ``take`` it to launch it."""
        if self.spent >= self.budget or leader is None or len(leader.samples) < 2:
            return None
        best: tuple[float, Candidate, Measured] | None = None
        for centre in ranked[:CENTRES]:
            for point in self._untried(centre, index, halve=centre.key == leader.key):
                rating = self.points.predicted(point)
                if best is None or rating > best[0]:
                    best = (rating, point, centre)
        return None if best is None else (best[1], best[2])

    def take(self, point: Candidate, centre: Measured) -> dict[str, Any]:
        """Spend one launch of the budget on ``point`` (a proposal around ``centre``)."""
        self._steps.setdefault(point.key, dict(self._steps[centre.key]))
        self.spent += 1
        return dict(point.params)

    def shift(self, point: Candidate, centre: Measured) -> float:
        """What the simulator predicts ``point`` gains over ``centre`` (log scale; 0 when
        it cannot predict one of them)."""
        home = self.points.candidate(centre.params)
        if home is None:
            return 0.0
        gain = self.points.predicted(point) - self.points.predicted(home)
        return gain if math.isfinite(gain) else 0.0

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
        if point is not None or step < 0:
            return point
        last: Candidate | None = None
        inside, outside = start, min(1.0, end)
        for _ in range(BISECTIONS):
            middle = (inside + outside) / 2
            value = knob.value(middle)
            if value in (knob.value(inside), knob.value(outside)):
                break
            found = self._allowed({**params, knob.name: value})
            if found is None:
                outside = middle
            else:
                inside, last = middle, found
        return last

    def _allowed(self, params: dict[str, Any]) -> Candidate | None:
        """The launch, when the rules and the pre-screen allow it and the simulator
        predicts it runs (and no OOM launch ruled it out)."""
        point = self.points.proposable(params)
        if point is None or not math.isfinite(self.points.predicted(point)):
            return None
        return point

    def _answered(self, point: Candidate, index: MeasuredIndex) -> bool:
        """Measured, being measured, or alike a measured config: one parameter apart and
        predicted within ``ALIKE`` (a twin one categorical apart; max-num-seqs above the
        load's concurrency). Another run of the same behaviour under a new name would only
        give the crown one more noisy draw of it."""
        if point.key in index.by_key or point.key in index.pending:
            return True
        rating = self.points.predicted(point)
        for entry in index.by_key.values():
            names = entry.params.keys() | point.params.keys()
            if sum(entry.params.get(n) != point.params.get(n) for n in names) > 1:
                continue
            other = self.points.candidate(entry.params)
            if other is not None and abs(self.points.predicted(other) - rating) < ALIKE:
                return True
        return False
