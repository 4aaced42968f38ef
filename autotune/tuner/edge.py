"""The memory edge located, not only avoided: after an OOM, edges retreat to what fits.

The lattice holds each memory edge of the prefill chunk (``lattice``: the largest chunk
that fits beside a row's lattice points), and there the best config often lies: a chunk
past a lattice point can cross into another regime. The memory model is an estimate, so
the first edge launched can run out of memory, and the back-off (``tuner.backoff``) then
presumes every config about as tight to do the same: every edge at once. The field
notes' user lowers the knob that ran out and tries again. ``EdgeSearch.retreat`` does so
for the ``EDGE_ROWS`` best-estimated edges the back-off rules out (the simulator plus
the residual learned so far; one of each prediction): along each continuous knob (the
chunk, then the KV pool), the largest value between the row's lattice point below the
edge and the edge that the memory model, shifted by the back-off, lets run (bisection in
the knob's unit coordinates). A retreat joins the guide when the simulator rates it
above that lattice point (the gain rises towards the edge), marked as an edge itself,
so a further OOM moves it again; the sampler ranks it with the rest. On the memory-edge
bench (a 24 GB card, 8 Claude Code sessions, memory 4% dearer than the model), the
simulator's best edges run out of memory; 1,650 to 1,820 batched tokens beside them run
3% above the lattice's optimum.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from autotune.tuner.guide import SAME_PREDICTION, Guide
from autotune.tuner.kv_bounds import KV_FLAG
from autotune.tuner.lattice import CHUNK_FLAG, Candidate
from autotune.tuner.refine import Refiner, _Knob

# Edges retreated after each OOM that moves the back-off: not only the best-estimated
# few, as the residual learned from the first launches can rank the row of the best
# config low (on the memory-edge bench, at 8, 5 of 28 studies never launched a config
# within 1% of the best; at 32, 3: docs/benchmarks.md, "Every edge row retreats").
EDGE_ROWS = 32
BISECTIONS = 12  # halvings that find a retreat (down to the knob's grid)


class EdgeSearch:
    """The retreats of one run (see the module docstring)."""

    def __init__(self, points: Refiner) -> None:
        self.points = points  # the rules, pre-screen, back-off and predictions of the run
        self.retreated: set[str] = set()  # edges retreated once (a retreat is an edge itself)
        flags = {name: getattr(p, "flag", None) for name, p in points.space.parameters.items()}
        self.knobs = [
            knob
            for flag in (CHUNK_FLAG, KV_FLAG)
            for knob in points.knobs
            if flags[knob.name] == flag
        ]
        chunks = [k.name for k in self.knobs if flags[k.name] == CHUNK_FLAG]
        self._chunk = chunks[0] if chunks else None

    def retreat(self, guide: Guide, estimate: np.ndarray) -> int:
        """Retreat the best-estimated edges of ``guide`` that the back-off rules out
        (``estimate``: the corrected utility of each candidate); how many retreats joined
        the guide."""
        if not self.knobs:
            return 0
        backoff = self.points.backoff
        ruled_out = [
            i
            for i, c in enumerate(guide.candidates)
            if c.edge and c.key not in self.retreated and backoff.presumes_oom(c.memory)
        ]
        ruled_out.sort(key=lambda i: -_finite(estimate[i]))
        found: dict[str, Candidate] = {}
        taken: list[float] = []
        for i in ruled_out:
            if len(taken) == EDGE_ROWS or not math.isfinite(estimate[i]):
                break
            if any(abs(estimate[i] - t) < SAME_PREDICTION for t in taken):
                continue
            taken.append(float(estimate[i]))
            edge = guide.candidates[i]
            self.retreated.add(edge.key)
            below = self._below(guide, edge)
            floor = self.points.predicted(below) if below is not None else -math.inf
            for knob in self.knobs:
                point = self._retreat(edge, knob, below)
                if point is None or point.key in guide.by_key or point.key in found:
                    continue
                if self.points.predicted(point) > _finite(floor):
                    found[point.key] = replace(point, edge=True)
        added = list(found.values())
        guide.extend(
            added,
            [self.points.cache[c.key] for c in added],
            [self.points.predicted(c) for c in added],
        )
        return len(added)

    def _below(self, guide: Guide, edge: Candidate) -> Candidate | None:
        """The lattice point of ``edge``'s row just below it along the chunk."""
        chunk = self._chunk
        if chunk is None or chunk not in edge.params:
            return None
        rest = {k: v for k, v in edge.params.items() if k != chunk}
        below = [
            c
            for c in guide.candidates
            if not c.edge
            and c.params.get(chunk, math.inf) < edge.params[chunk]
            and {k: v for k, v in c.params.items() if k != chunk} == rest
        ]
        return max(below, key=lambda c: c.params[chunk], default=None)

    def _retreat(self, edge: Candidate, knob: _Knob, below: Candidate | None) -> Candidate | None:
        """The largest value of ``knob`` under ``edge``'s that the back-off allows, the
        other knobs as they are: the chunk by bisection down to the lattice point below
        (or the knob's low bound), the KV pool step by step down its grid; None when none
        is, or when the simulator predicts it would not run."""
        now = knob.unit(edge.params[knob.name])
        if knob.name == self._chunk:
            inside = knob.unit(below.params[knob.name]) if below is not None else 0.0
            if not self._allowed(edge, knob, inside):
                return None
            outside = now
            for _ in range(BISECTIONS):
                middle = (inside + outside) / 2
                if knob.value(middle) in (knob.value(inside), knob.value(outside)):
                    break
                if self._allowed(edge, knob, middle):
                    inside = middle
                else:
                    outside = middle
            value = knob.value(inside)
        else:
            step = knob.grid or (knob.dist.high - knob.dist.low) / 32
            value = edge.params[knob.name]
            while value > knob.dist.low:
                value = knob.snap(value - step)
                if self._allowed(edge, knob, knob.unit(value)):
                    break
            else:
                return None
        if value == edge.params[knob.name]:
            return None
        point = self.points.proposable({**edge.params, knob.name: value})
        if point is None or not math.isfinite(self.points.predicted(point)):
            return None
        return point

    def _allowed(self, edge: Candidate, knob: _Knob, unit: float) -> bool:
        """Whether ``edge`` with ``knob`` at ``unit`` passes the rules, the pre-screen and
        the back-off (the memory model alone: no simulator run)."""
        return self.points.proposable({**edge.params, knob.name: knob.value(unit)}) is not None


def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else -math.inf
