"""Objectives, SLOs and scoring: a pure function from measurements to values + constraints.

Every trial gets the same constraint keys (GPSampler requires it): ``oom``,
``crash``, ``error_rate`` and one ``slo:<name>`` per SLO. A value > 0 violates.
A trial that produced no measurements (it OOMed, crashed, was predicted to
OOM) gets a placeholder objective value chosen by the study (the worst
feasible so far), never NaN or an extreme.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from autotune.errors import InputError
from autotune.replay.load import RequestSlo
from autotune.replay.records import Percentiles, ReplayStats
from autotune.vocabulary import Failure, Outcome


class ObjectiveName(StrEnum):
    THROUGHPUT = "throughput"  # output tokens/s, maximize
    GOODPUT = "goodput"  # requests/s meeting every SLO, maximize
    LATENCY = "latency"  # p95 end-to-end seconds at the workload's load, minimize


DIRECTIONS: dict[ObjectiveName, Literal["maximize", "minimize"]] = {
    ObjectiveName.THROUGHPUT: "maximize",
    ObjectiveName.GOODPUT: "maximize",
    ObjectiveName.LATENCY: "minimize",
}
METRIC_NAMES: dict[ObjectiveName, str] = {
    ObjectiveName.THROUGHPUT: "output_tok_s",
    ObjectiveName.GOODPUT: "goodput_rps",
    ObjectiveName.LATENCY: "e2e_p95_s",
}


def parse_objectives(text: str) -> list[ObjectiveName]:
    """``"throughput"`` or a comma list such as ``"throughput,latency"`` (a Pareto study)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    known = ", ".join(name.value for name in ObjectiveName)
    if not names:
        raise InputError(f"--objective: empty (known: {known})")
    objectives = []
    for name in names:
        try:
            objectives.append(ObjectiveName(name))
        except ValueError:
            raise InputError(f"--objective: unknown objective {name!r} (known: {known})") from None
    if len(set(objectives)) != len(objectives):
        raise InputError(f"--objective: {text!r} names an objective twice")
    return objectives


_SLO_PATTERN = re.compile(
    r"^(?P<metric>ttft|tpot|itl|e2e)_(?P<stat>mean|p50|p90|p95|p99)"
    r"\s*(?P<op><=|<)\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m)$"
)
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0}


class Slo(BaseModel):
    """One latency limit, e.g. ``ttft_p95<=2s``."""

    model_config = ConfigDict(frozen=True)

    metric: Literal["ttft", "tpot", "itl", "e2e"]
    stat: Literal["mean", "p50", "p90", "p95", "p99"]
    limit_s: float
    text: str

    @property
    def key(self) -> str:
        return f"slo:{self.metric}_{self.stat}"

    def measured_s(self, stats: ReplayStats) -> float | None:
        percentiles: Percentiles = getattr(stats, self.metric)
        return getattr(percentiles, self.stat)


def parse_slo(text: str) -> Slo:
    """Parse ``ttft_p95<=2s`` strictly: metric_stat, <= or <, a number, a unit (ms, s, m)."""
    match = _SLO_PATTERN.match(text.strip())
    if match is None:
        raise InputError(
            f"--slo {text!r}: expected METRIC_STAT<=VALUE UNIT, e.g. ttft_p95<=2s "
            "(metrics ttft, tpot, itl, e2e; stats mean, p50, p90, p95, p99; units ms, s, m)"
        )
    limit_s = float(match["value"]) * _UNIT_S[match["unit"]]
    if limit_s <= 0:
        raise InputError(f"--slo {text!r}: the limit must be > 0")
    return Slo(metric=match["metric"], stat=match["stat"], limit_s=limit_s, text=text.strip())


def parse_slos(texts: list[str]) -> list[Slo]:
    slos = [parse_slo(text) for text in texts]
    keys = [slo.key for slo in slos]
    if len(set(keys)) != len(keys):
        raise InputError(f"--slo: the same metric is limited twice: {', '.join(texts)}")
    return slos


def request_slo(slos: list[Slo]) -> RequestSlo | None:
    """Per-request thresholds for goodput: each metric's tightest limit."""
    limits: dict[str, float] = {}
    for slo in slos:
        if slo.metric in ("ttft", "tpot", "e2e"):
            limits[slo.metric] = min(limits.get(slo.metric, slo.limit_s), slo.limit_s)
    if not limits:
        return None
    return RequestSlo(ttft_s=limits.get("ttft"), tpot_s=limits.get("tpot"), e2e_s=limits.get("e2e"))


@dataclass(frozen=True)
class Goal:
    """What a study optimises and the limits it must respect."""

    objectives: list[ObjectiveName]
    slos: list[Slo]
    max_error_rate: float = 0.0

    @property
    def directions(self) -> list[str]:
        return [DIRECTIONS[name] for name in self.objectives]

    @property
    def metric_names(self) -> list[str]:
        return [METRIC_NAMES[name] for name in self.objectives]

    @property
    def constraint_keys(self) -> list[str]:
        return ["oom", "crash", "error_rate", *(slo.key for slo in self.slos)]


@dataclass(frozen=True)
class Score:
    """Objective values (None: no measurement, the study supplies a placeholder)."""

    values: list[float] | None
    constraints: dict[str, float]
    outcome: str

    @property
    def feasible(self) -> bool:
        return self.values is not None and all(v <= 0 for v in self.constraints.values())


def score(
    goal: Goal,
    *,
    stats: ReplayStats | None,
    failure: Failure | None,
    memory_margin: float | None = None,
    outcome_override: str | None = None,
) -> Score:
    """Values and constraints for one trial.

    ``memory_margin`` is needed/available - 1 from the memory model when known
    (negative when the config fits), which gives the ``oom`` constraint a
    gradient the GP can learn from.
    """
    is_oom = outcome_override == Outcome.PREDICTED_OOM or (
        failure is not None and failure.failure_class.is_oom
    )
    if is_oom:
        oom = max(memory_margin if memory_margin is not None else 1.0, 0.05)
    else:
        oom = min(memory_margin if memory_margin is not None else -1.0, -0.01)
    crashed = failure is not None and not failure.failure_class.is_oom
    crash_outcomes = (Outcome.RULE_VIOLATED, Outcome.TRIAL_TIMEOUT)
    crash = 1.0 if crashed or outcome_override in crash_outcomes else -1.0

    measured = stats is not None and stats.completed > 0 and failure is None
    constraints = {"oom": oom, "crash": crash}
    if not measured:
        constraints["error_rate"] = 1.0
        for slo in goal.slos:
            constraints[slo.key] = 1.0
        if outcome_override is not None:
            outcome = outcome_override
        elif failure is not None:
            outcome = failure.failure_class.value
        else:
            outcome = Outcome.NO_REQUESTS.value
        return Score(values=None, constraints=constraints, outcome=outcome)

    assert stats is not None  # narrowed by `measured`
    constraints["error_rate"] = stats.error_rate - goal.max_error_rate
    slo_missed = False
    for slo in goal.slos:
        value = slo.measured_s(stats)
        margin = 1.0 if value is None else value / slo.limit_s - 1.0
        constraints[slo.key] = margin
        slo_missed |= margin > 0
    values = [_objective_value(name, stats) for name in goal.objectives]
    if outcome_override == Outcome.PRUNED:  # stopped early: figures so far, not a result
        outcome = Outcome.PRUNED.value
    elif constraints["error_rate"] > 0:
        outcome = Outcome.ERRORS.value
    elif slo_missed:
        outcome = Outcome.SLO_VIOLATED.value
    else:
        outcome = Outcome.OK.value
    return Score(values=values, constraints=constraints, outcome=outcome)


def _objective_value(name: ObjectiveName, stats: ReplayStats) -> float:
    if name is ObjectiveName.THROUGHPUT:
        return stats.output_throughput_tok_s
    if name is ObjectiveName.GOODPUT:
        return stats.goodput_rps if stats.goodput_rps is not None else stats.request_throughput_rps
    e2e = stats.e2e.p95
    return e2e if e2e is not None else stats.duration_s
