"""Each GPU kind's fleet: its config tuned on the simulator, then sized and priced.

Per GPU kind: the space is tuned for the card at one replica's share of the target load
(``results/what_if.py``'s ``tune_space``: the KV range scaled to the card, the whole
lattice screened and its best replayed, the warm start's prediction cache read and filled), and the
fewest replicas found for that config (``sizing.py``). While that is R > 1 (at most
``MAX_TUNINGS`` tunings), the space is tuned again at the share of R - 1 replicas, the
config that meets the SLOs under that heavier share if any, and sized again; the configs
that won on the GPU kinds planned before are tried too (the replay judges only the
screen's short list). The smallest fleet is kept, the higher throughput on a tie. Then its
headroom, its cost and the limit that sets its replica count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.catalog.prices import SECONDS_PER_HOUR
from autotune.config.space import SearchSpace
from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError
from autotune.fleet.routing import most_replicas, split_load, split_plan
from autotune.fleet.sizing import FleetModel, FleetPrediction, fewest_replicas, headroom
from autotune.replay.load import LoadSpec
from autotune.results.what_if import TunedForGpu, tune_space
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.trial.objective import Goal
from autotune.workload.plan import WorkloadPlan

TOKENS_PER_MILLION = 1_000_000
TP_FLAG = "tensor-parallel-size"
MAX_TUNINGS = 3  # per GPU kind
# A plan's tuning: every config screened, the replay judging the screen's best 16 distinct
# predictions and their neighbours (a warm start's: 2% of the lattice, 84 on an 80 GB card).
SHORTLIST = 16


@dataclass(frozen=True)
class PlanInputs:
    """What every candidate is planned for."""

    plan: WorkloadPlan
    load: LoadSpec  # the target load, over the whole fleet
    goal: Goal
    space: SearchSpace
    model: str  # as deployed (a path or id)
    sim_model: str  # the simulator catalog's model
    engine_version: str
    calibration: CalibrationProfile | None = None
    cache_path: Path | None = None  # the disk prediction cache (None: none)


@dataclass(frozen=True)
class Candidate:
    """One GPU kind's planned fleet (``replicas`` None: no fleet meets the limits)."""

    gpu: str
    tp: int
    usd_per_gpu_hour: float
    replicas: int | None
    config: TrialConfig | None
    fleet: FleetPrediction | None
    binding: str  # the limit that sets the replica count, in words
    headroom: float = 1.0  # the target load times this still meets every limit
    breaks_on: str | None = None  # the limit that breaks above the headroom
    calibrated: bool = False
    # The configs weighed for this GPU kind: its tuning's (the space's lattice configs that
    # start on it, as tune_space reports them) and the other kinds' winners sized here.
    configs_considered: int | None = None

    @property
    def gpus(self) -> int | None:
        return None if self.replicas is None else self.replicas * self.tp

    @property
    def usd_per_hour(self) -> float | None:
        return None if self.gpus is None else self.gpus * self.usd_per_gpu_hour

    @property
    def output_tok_s(self) -> float | None:
        stats = self.fleet.stats if self.fleet else None
        return None if stats is None else stats.output_throughput_tok_s

    @property
    def usd_per_million_tokens(self) -> float | None:
        if self.usd_per_hour is None or not self.output_tok_s:
            return None
        return self.usd_per_hour / (self.output_tok_s * SECONDS_PER_HOUR) * TOKENS_PER_MILLION


def applying(
    calibration: CalibrationProfile | None, gpu: str, model: str
) -> CalibrationProfile | None:
    """``calibration`` when it was fitted for this GPU and model (or for any)."""
    if calibration is None or calibration.hardware not in (None, gpu):
        return None
    return calibration if calibration.model in (None, model) else None


def with_tp(config: TrialConfig, tp: int) -> TrialConfig:
    """``config`` sharded over ``tp`` GPUs (TP 1: vLLM's default, no flag)."""
    flags = {name: value for name, value in config.flags.items() if name != TP_FLAG}
    return config.model_copy(update={"flags": flags | ({TP_FLAG: tp} if tp > 1 else {})})


def space_with_tp(space: SearchSpace, tp: int) -> SearchSpace:
    """``space`` with every trial sharded over ``tp`` GPUs (TP 1: unchanged)."""
    if tp == 1:
        return space
    return space.model_copy(update={"fixed": space.fixed | {TP_FLAG: tp}})


def _tuned(
    inputs: PlanInputs, gpu: str, tp: int, replicas: int, say: Callable[[str], None]
) -> TunedForGpu:
    """The space tuned for ``gpu`` x ``tp`` at one replica's share of the load over
    ``replicas``."""
    share_plan = split_plan(inputs.plan, replicas)[0]
    share_load = split_load(inputs.load, replicas)[0]
    say(f"{gpu} TP {tp}: tuning the space for one of {replicas} replica(s) on the simulator")
    return tune_space(
        space_with_tp(inputs.space, tp),
        gpu=gpu,
        model=inputs.model,
        sim_model=inputs.sim_model,
        engine_version=inputs.engine_version,
        goal=inputs.goal,
        maximize=True,
        plan=share_plan,
        load=share_load,
        calibration=applying(inputs.calibration, gpu, inputs.sim_model),
        cache_path=inputs.cache_path,
        shortlist=SHORTLIST,
    )


def _better(first: FleetPrediction | None, second: FleetPrediction | None) -> bool:
    """Is ``second`` a better fleet than ``first`` (fewer replicas, then more tok/s)?"""
    if second is None:
        return False
    if first is None:
        return True
    if second.replicas != first.replicas:
        return second.replicas < first.replicas
    assert first.stats is not None and second.stats is not None
    return second.stats.output_throughput_tok_s > first.stats.output_throughput_tok_s


def _binding(model: FleetModel, fleet: FleetPrediction, load: LoadSpec) -> str:
    """Why this many replicas: the limit one fewer breaks, or the nearest with one."""
    if fleet.replicas == 1:
        margin = fleet.margins[fleet.binding]
        return f"one replica suffices; nearest limit {fleet.binding} ({margin:+.0%})"
    fewer = model.predict(fleet.replicas - 1, load)
    if fewer.failure is not None:
        return f"{fleet.replicas - 1} replicas: {fewer.failure}"
    return f"{fewer.binding} with {fewer.replicas} ({fewer.margins[fewer.binding]:+.0%})"


def plan_gpu(
    inputs: PlanInputs,
    gpu: str,
    usd_per_gpu_hour: float,
    say: Callable[[str], None],
    *,
    tp: int = 1,
    others: Sequence[TrialConfig] = (),
) -> Candidate:
    """The cheapest fleet of ``gpu`` with ``tp`` GPUs a replica (module docstring);
    ``others``: configs that won on other candidates, kept (at this TP) when one needs fewer
    replicas here (the replay judges only the screen's short list)."""
    calibration = applying(inputs.calibration, gpu, inputs.sim_model)
    best: tuple[FleetModel, FleetPrediction] | None = None
    replicas, tuned_for, considered = 1, set(), 0
    while replicas not in tuned_for and len(tuned_for) < MAX_TUNINGS:
        tuned_for.add(replicas)
        try:
            tuned = _tuned(inputs, gpu, tp, replicas, say)
        except InputError as exc:  # NoConfigStarts too: nothing starts on the card
            return Candidate(gpu, tp, usd_per_gpu_hour, None, None, None, str(exc))
        config, considered = tuned.config, max(considered, tuned.configs)
        model = FleetModel(
            config, gpu, inputs.sim_model, inputs.plan, inputs.goal, calibration=calibration
        )
        fleet = fewest_replicas(model, inputs.load, say=say)
        if _better(best[1] if best else None, fleet):
            assert fleet is not None
            best = (model, fleet)
        # Fewer replicas is what a plan buys, not the last percent of a replica's
        # throughput: a config near the best that meets the limits with one fewer wins (the
        # README's plan: 4,096 batched tokens serve 0.3% more than 2,048 at an H100's share
        # and miss the 3-s p95 TTFT by 1% at 2 replicas, where 2,048 holds it).
        for near in tuned.near:
            if best is None or best[1].replicas == 1:
                break
            model = FleetModel(
                near, gpu, inputs.sim_model, inputs.plan, inputs.goal, calibration=calibration
            )
            if model.predict(best[1].replicas - 1, inputs.load).meets:
                fleet = fewest_replicas(model, inputs.load)
                assert fleet is not None
                best = (model, fleet)
                considered += 1
        if best is None or best[1].replicas == 1:
            break
        replicas = best[1].replicas - 1  # a config that meets the SLOs with one fewer?
    for other in others:
        if best is None or best[1].replicas == 1:
            break
        config, considered = with_tp(other, tp), considered + 1
        model = FleetModel(
            config, gpu, inputs.sim_model, inputs.plan, inputs.goal, calibration=calibration
        )
        if model.predict(best[1].replicas - 1, inputs.load).meets:
            say(f"{gpu}: the config that won on another GPU kind needs fewer replicas here")
            fleet = fewest_replicas(model, inputs.load)
            assert fleet is not None
            best = (model, fleet)
    if best is None:
        most = most_replicas(inputs.plan, inputs.load)
        tried = model.predict(most, inputs.load)  # the sizing's last try (memoised)
        return Candidate(
            gpu, tp, usd_per_gpu_hour, None, None, None,
            f"no fleet meets the limits; {most} replicas (one session each at most): "
            f"{tried.summary()}",
            configs_considered=considered,
        )  # fmt: skip
    model, fleet = best
    held, breaks_on = headroom(model, fleet.replicas, inputs.load)
    return Candidate(
        gpu=gpu,
        tp=tp,
        usd_per_gpu_hour=usd_per_gpu_hour,
        replicas=fleet.replicas,
        config=model.config,
        fleet=fleet,
        binding=_binding(model, fleet, inputs.load),
        headroom=held,
        breaks_on=breaks_on,
        calibrated=calibration is not None,
        configs_considered=considered,
    )


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """Cheapest per hour first (then per million tokens); those with no fleet last."""
    return sorted(
        candidates,
        key=lambda c: (
            c.usd_per_hour is None,
            c.usd_per_hour or 0.0,
            c.usd_per_million_tokens or 0.0,
        ),
    )
