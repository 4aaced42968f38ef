"""How many replicas a config needs: the fleet's replay predicted in virtual time.

A fleet of R replicas is predicted as its replicas' replays side by side
(``routing.py``): each replica's sessions at its share of the load, on the simulator; the
fleet's figures are those of every replica's requests together, scored against the
goal as one trial is. The fewest replicas that meet every limit are found by doubling
then bisection, which assumes more replicas do not hurt (each gets fewer sessions; each
also warms its own prefix cache, so near the limit they can, a little), and the
headroom by raising the load on that fleet until a limit breaks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.config.trial_config import TrialConfig
from autotune.fleet.routing import most_replicas, routed_units, scaled, split_load, split_plan
from autotune.replay.load import LoadSpec
from autotune.replay.records import ReplayStats
from autotune.replay.stats import compute_stats
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.trial.objective import Goal, request_slo, score
from autotune.tuner.predictor import SimOracle
from autotune.workload.plan import WorkloadPlan

HEADROOM_FACTORS = (1.25, 1.5, 2.0, 3.0)  # loads tried above the target, in order
STALLED = 0.1  # a margin that moves less than this with twice the replicas has stalled


@dataclass(frozen=True)
class FleetPrediction:
    """One fleet's predicted replay: its figures and each limit's margin (> 0 breaks it)."""

    replicas: int
    stats: ReplayStats | None  # None: a replica failed (its failure in ``failure``)
    margins: dict[str, float]  # constraint key -> value/limit - 1 (score()'s constraints)
    failure: str | None = None  # a replica's failure class, or why the replay stopped

    @property
    def meets(self) -> bool:
        return self.failure is None and all(margin <= 0 for margin in self.margins.values())

    def summary(self) -> str:
        """``meets the limits (nearest slo:ttft_p95 -35%)`` or ``slo:ttft_p95 +80%``."""
        if self.failure is not None:
            return self.failure
        key = self.binding
        if self.meets:
            return f"meets the limits (nearest {key} {self.margins[key]:+.0%})"
        return f"misses {key} by {self.margins[key]:+.0%}"

    @property
    def binding(self) -> str:
        """The limit nearest to breaking (or broken the most): ``slo:ttft_p95``, ..."""
        if self.failure is not None:
            return self.failure
        slos = [key for key in self.margins if key.startswith("slo:")]
        if self.margins.get("error_rate", 0.0) > 0 or not slos:
            slos.append("error_rate")
        return max(slos, key=lambda key: self.margins[key])


@dataclass
class FleetModel:
    """Predicts fleets of one config on one GPU over one workload and goal (memoised)."""

    config: TrialConfig
    gpu: str
    sim_model: str
    plan: WorkloadPlan
    goal: Goal
    calibration: CalibrationProfile | None = None
    _memo: dict[tuple[int, LoadSpec], FleetPrediction] = field(default_factory=dict)

    def predict(self, replicas: int, load: LoadSpec) -> FleetPrediction:
        """The fleet of ``replicas`` replicas under ``load``, routed by session."""
        key = (replicas, load)
        if key not in self._memo:
            self._memo[key] = self._predict(replicas, load)
        return self._memo[key]

    def _predict(self, replicas: int, load: LoadSpec) -> FleetPrediction:
        records = []
        for sub_plan, sub_load in zip(
            split_plan(self.plan, replicas), split_load(load, replicas), strict=True
        ):
            if not sub_plan.requests:
                continue
            oracle = SimOracle(
                hardware=self.gpu,
                sim_model=self.sim_model,
                plan=sub_plan,
                load=sub_load,
                goal=self.goal,
                calibration=self.calibration,
            )
            prediction = oracle.predict(self.config)
            if prediction is None:
                return FleetPrediction(replicas, None, {}, "the simulator rejects the config")
            if prediction.failure is not None:
                return FleetPrediction(replicas, None, {}, prediction.failure.failure_class)
            if prediction.stats.stopped_early:
                return FleetPrediction(replicas, None, {}, "saturated")
            records += prediction.records
        records.sort(key=lambda record: record.send_s)
        stats = compute_stats(records, slo=request_slo(self.goal.slos))
        scored = score(self.goal, stats=stats, failure=None)
        margins = {k: v for k, v in scored.constraints.items() if k not in ("oom", "crash")}
        return FleetPrediction(replicas, stats, margins)


def fewest_replicas(
    fleet: FleetModel, load: LoadSpec, *, say: Callable[[str], None] | None = None
) -> FleetPrediction | None:
    """The smallest fleet that meets every limit at ``load`` (None: not even the most
    replicas the load can keep busy do). When doubling the replicas moves the binding
    limit by under ``STALLED`` of itself (a cold prefill, not the load, sets it), the most
    replicas are tried next: if they miss too, no fleet meets the limits."""
    most = most_replicas(fleet.plan, load)
    low, high = 0, 1  # low: known to miss (0: none tried)
    missed: FleetPrediction | None = None
    while True:
        tried = fleet.predict(high, load)
        if say is not None:
            say(f"  {high} replica(s): {tried.summary()}")
        if tried.meets:
            break
        if high >= most:
            return None
        low, high = high, min(high * 2, most)
        if _stalled(missed, tried):
            high = most
        missed = tried
    while high - low > 1:
        middle = (low + high) // 2
        if fleet.predict(middle, load).meets:
            high = middle
        else:
            low = middle
    return fleet.predict(high, load)


def _stalled(before: FleetPrediction | None, after: FleetPrediction) -> bool:
    """Did twice the replicas leave the binding limit's margin where it was?"""
    if before is None or before.failure is not None or after.failure is not None:
        return False
    key = after.binding
    return after.margins[key] > (1 - STALLED) * before.margins.get(key, 0.0)


def headroom(fleet: FleetModel, replicas: int, load: LoadSpec) -> tuple[float, str | None]:
    """How far the load can rise on ``replicas`` replicas: (the heaviest load tried, over
    the target, that still meets every limit, 1.0 if none; the limit that breaks first
    above it, None if none does). A sessions load rises only as far as the workload has
    sessions."""
    held = 1.0
    units = routed_units(fleet.plan)
    tried_loads = {load}
    for factor in HEADROOM_FACTORS:
        heavier = scaled(load, factor)
        if load.mode != "trace":
            heavier = heavier.model_copy(update={"concurrency": min(heavier.concurrency, units)})
        if heavier in tried_loads:
            break  # the workload has no more sessions to add
        tried_loads.add(heavier)
        tried = fleet.predict(replicas, heavier)
        if not tried.meets:
            return held, tried.binding
        held = factor if load.mode == "trace" else heavier.concurrency / load.concurrency
    return held, None
