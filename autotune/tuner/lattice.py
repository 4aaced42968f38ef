"""The lattice of effective configs: every distinct launch a space can make, deduplicated.

Each parameter gets a short ladder of values (all choices; powers of two for
log-scaled integers; at most ``MAX_LINEAR_POINTS`` step-aligned values for
linear ranges). The product is filtered by the space's rules, turned into
TrialConfigs through the same derivation as a trial (``derive_config``), and
deduplicated on the flags that are launched: a derived rule that overrides a
searched value (2N-1 batched tokens with MTP and LMCache on) makes many
searched points one launch.

The lattice also holds each memory edge of the prefill chunk (max-num-batched-tokens):
where, all else equal, one of its lattice values passes the memory pre-screen and the
next does not, the largest value between them that passes (``_Deriver.edges``). The field
notes' "raise until OOM, back off", done on the memory model: past the edge's lower
lattice point a chunk can cross into another regime (on a 24 GB long-context case, 2.5
GiB of KV beside LMCache runs 29-35 tok/s with 1,024 to 1,568 batched tokens and 57 with
1,600 to 1,840, the best config known there, and 2,048 does not fit), which no lattice
point shows.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

import optuna

from autotune.config.space import SearchSpace
from autotune.config.trial_config import TrialConfig
from autotune.trial.run import MemoryEstimate, Prescreen, derive_config

MAX_LINEAR_POINTS = 8  # a linear range gets at most this many values
LOG_POINTS = 9  # a log-scaled float range gets this many values
CHUNK_FLAG = "max-num-batched-tokens"  # the knob whose memory edges the lattice holds
EDGE_RESOLUTION = 0.02  # an edge is found to within 2% of its value


@dataclass
class Candidate:
    """One effective config of the lattice."""

    params: dict[str, Any]
    config: TrialConfig
    key: str  # identity of the launch: model + flags
    memory: MemoryEstimate | None = None
    edge: bool = False  # a memory edge of the chunk (``_Deriver.edges``), not a ladder value


def config_key(config: TrialConfig) -> str:
    """What makes two trials the same launch: the model and the flags (env aside)."""
    return json.dumps([config.model, config.flags], sort_keys=True, default=str)


def ladder(distribution: Any) -> list[Any]:
    """The values of one parameter the lattice visits (see the module docstring)."""
    dists = optuna.distributions
    if isinstance(distribution, dists.CategoricalDistribution):
        return list(distribution.choices)
    low, high = distribution.low, distribution.high
    is_int = isinstance(distribution, dists.IntDistribution)
    if distribution.log and is_int:
        powers = [2**e for e in range(math.ceil(math.log2(low)), math.floor(math.log2(high)) + 1)]
        return sorted({low, high, *powers})
    if distribution.log:
        ratio = (high / low) ** (1 / (LOG_POINTS - 1))
        return [low * ratio**i for i in range(LOG_POINTS - 1)] + [high]
    step = distribution.step or (high - low) / (MAX_LINEAR_POINTS - 1)
    count = round((high - low) / step) + 1
    stride = max(1, math.ceil((count - 1) / (MAX_LINEAR_POINTS - 1)))
    indices = list(range(0, count, stride))
    if indices[-1] != count - 1:
        indices.append(count - 1)
    values = [low + i * step for i in indices]
    return [int(v) for v in values] if is_int else [round(v, 9) for v in values]


def lattice_params(space: SearchSpace, engine_version: str | None) -> list[dict[str, Any]]:
    """Every lattice point that the space's rules allow (before deduplication)."""
    distributions = space.distributions(engine_version)
    names = list(distributions)
    ladders = [ladder(distributions[name]) for name in names]
    points = (dict(zip(names, values, strict=True)) for values in itertools.product(*ladders))
    return [params for params in points if not space.rule_violations(params)]


@dataclass(frozen=True)
class _Deriver:
    """What turns lattice points into configs with their memory (in every worker)."""

    space: SearchSpace
    model: str
    engine_version: str | None
    prescreen: Prescreen | None
    reported_block_size: int | None
    memo: dict[str, MemoryEstimate | None] = field(default_factory=dict)  # by launch key

    def screen(self, config: TrialConfig) -> MemoryEstimate | None:
        key = config_key(config)
        if key not in self.memo:
            self.memo[key] = self.prescreen(config) if self.prescreen is not None else None
        return self.memo[key]

    def derive(self, points: list[dict[str, Any]]) -> list[Candidate]:
        """The candidates of ``points``: each distinct launch once, where it first occurs."""
        found: dict[str, Candidate] = {}
        for params in points:
            candidate = self.candidate(params)
            found.setdefault(candidate.key, candidate)
        return list(found.values())

    def candidate(self, params: dict[str, Any]) -> Candidate:
        config = derive_config(
            self.space,
            params,
            model=self.model,
            engine_version=self.engine_version,
            reported_block_size=self.reported_block_size,
            prescreen=self.screen if self.prescreen is not None else None,
        )
        return Candidate(params, config, config_key(config), self.screen(config))

    def fits(self, params: dict[str, Any]) -> bool:
        memory = self.candidate(params).memory
        return memory is None or memory.fits

    def fits_worst_step(self, params: dict[str, Any]) -> bool:
        """Whether ``params`` passes the pre-screen with room for its worst step: a full
        prefill chunk beside the sampler buffers of every seat (max-num-seqs), which the
        engine may schedule together; the pre-screen counts one seat's."""
        memory = self.candidate(params).memory
        if memory is None:
            return True
        report = memory.report
        seats = max(1, int(report.get("max_num_seqs", 1)))
        others = (seats - 1) * float(report.get("transient_bytes_per_seq", 0.0))
        spare = report.get("headroom_bytes", 0) - report.get("load_transient_bytes", 0)
        return memory.fits and spare >= others

    def edges(self, rows: list[list[dict[str, Any]]]) -> list[Candidate]:
        """The memory edge of the chunk in each row (lattice points alike but for the
        chunk, in ascending order of it): the largest chunk that passes the pre-screen
        with room for its worst step (``fits_worst_step``) between the last lattice value
        that passes and the next, when there is one."""
        name = _chunk_name(self.space, self.engine_version)
        found: list[Candidate] = []
        for row in rows:
            fitting = [self.fits(params) for params in row]
            if not any(fitting) or fitting[-1]:
                continue
            last = max(i for i, fit in enumerate(fitting) if fit)
            low, high = row[last][name], row[last + 1][name]
            edge = low
            while high - low > max(1, low * EDGE_RESOLUTION):
                middle = round(math.sqrt(low * high))
                if self.fits_worst_step({**row[last], name: middle}):
                    low = edge = middle
                else:
                    high = middle
            params = {**row[last], name: edge}
            if edge != row[last][name] and not self.space.rule_violations(params):
                found.append(replace(self.candidate(params), edge=True))
        return found


def _chunk_name(space: SearchSpace, engine_version: str | None) -> str | None:
    """The searched integer parameter that sets the prefill chunk, if the space has one."""
    distributions = space.distributions(engine_version)
    for name, param in space.parameters.items():
        dist = distributions.get(name)
        if (
            getattr(param, "flag", None) == CHUNK_FLAG
            and isinstance(dist, optuna.distributions.IntDistribution)
            and dist.high > dist.low
        ):
            return name
    return None


def edge_rows(
    points: list[dict[str, Any]], space: SearchSpace, engine_version: str | None
) -> list[list[dict[str, Any]]]:
    """``points`` in rows alike but for the chunk, each in ascending order of it (none
    when the space does not search the chunk)."""
    name = _chunk_name(space, engine_version)
    if name is None:
        return []
    rows: dict[str, list[dict[str, Any]]] = {}
    for params in points:
        rest = repr(sorted((k, v) for k, v in params.items() if k != name))
        rows.setdefault(rest, []).append(params)
    return [sorted(row, key=lambda p: p[name]) for row in rows.values() if len(row) > 1]


def enumerate_effective(
    space: SearchSpace,
    *,
    model: str,
    engine_version: str | None,
    prescreen: Prescreen | None = None,
    reported_block_size: int | None = None,
) -> list[Candidate]:
    """The distinct effective configs of the lattice, in lattice order, each with its
    memory, then the chunk's memory edges. In this process: forked workers cost more in
    pickling the candidates back than they save (2.2 s in one process against 4.1 s on two
    workers for the README space's 6,720 points; scripts/bench_warm_start.py)."""
    deriver = _Deriver(space, model, engine_version, prescreen, reported_block_size)
    points = lattice_params(space, engine_version)
    rows = edge_rows(points, space, engine_version) if prescreen is not None else []
    seen: dict[str, Candidate] = {}
    for candidate in [*deriver.derive(points), *deriver.edges(rows)]:
        seen.setdefault(candidate.key, candidate)
    return list(seen.values())


def lattice_neighbours(points: list[dict[str, Any]]) -> list[list[int]]:
    """For each point, the points one step away along one parameter, the others alike:
    the next value below and above for a number, every other choice for a category."""
    neighbours: list[set[int]] = [set() for _ in points]
    names = sorted({name for params in points for name in params})
    for name in names:
        rows: dict[str, list[int]] = {}
        for index, params in enumerate(points):
            rest = repr(sorted((k, v) for k, v in params.items() if k != name))
            rows.setdefault(rest, []).append(index)
        for row in rows.values():
            if len(row) < 2:
                continue
            values = [points[i].get(name) for i in row]
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                ordered = sorted(row, key=lambda i: points[i][name])
                for low, high in itertools.pairwise(ordered):
                    neighbours[low].add(high)
                    neighbours[high].add(low)
            else:
                for i in row:
                    neighbours[i].update(j for j in row if j != i)
    return [sorted(found) for found in neighbours]
