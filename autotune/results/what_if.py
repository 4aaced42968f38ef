"""Tune a study's space for a GPU the user does not own, on the simulator: predictions only.

``compare --what-if GPU`` answers "what would this GPU do with my traffic?". The study's
best config was tuned for its own card (a 7 GiB KV pool and 6 sequences on a 32 GB
card); run as it is on an H200 it leaves most of the memory unused and understates the
card several times over. So the what-if tunes for the target the way the guided tuner
starts a study: the study's space with its KV range scaled to what the memory model says
starts on the target (``tuner/kv_bounds.py``), every effective config of its lattice
pre-screened by the target's memory model and predicted over the study's own workload
and load (the warm start, ``tuner/guide.py``), and the best predicted config that meets
the study's limits chosen. Nothing is launched.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.catalog.models import get_model
from autotune.config.space import FloatParam, SearchSpace, load_space
from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.results.reader import LoadedStudy
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.prompt import PromptRenderer
from autotune.sim.virtual.predict import Prediction
from autotune.trial.objective import Goal, ObjectiveName, parse_slos
from autotune.trial.preflight import MAX_MODEL_LEN_FLAG, Target, preflight
from autotune.trial.prescreen import make_prescreen
from autotune.tuner.guide import Guide, build_guide
from autotune.tuner.kv_bounds import KV_FLAG, largest_kv_pool_bytes, shaped
from autotune.tuner.lattice import lattice_neighbours
from autotune.tuner.prediction_cache import CachedPredictions
from autotune.tuner.predictor import SimOracle
from autotune.workload.plan import WorkloadPlan

NEAR = 0.02  # ``TunedForGpu.near``: within this share of the best config's value
MOST_NEAR = 8  # ... at most this many
WARM_START_BUDGET_S = 300.0  # as `autotune run`'s --warm-start-budget default


class NoConfigStarts(InputError):
    """The memory model says no config of the space starts on the GPU: an answer, shown."""


@dataclass(frozen=True)
class TunedForGpu:
    """The config the simulator picked for ``gpu``, its prediction, and what it searched."""

    gpu: str
    config: TrialConfig
    prediction: Prediction
    meets_limits: bool  # predicted to meet every SLO and the error limit
    configs: int  # effective configs of the lattice that the memory model lets start
    predicted_feasible: int
    kv_range_gib: tuple[float, float] | None  # the scaled KV range searched
    # Replayed configs that also meet the limits within ``NEAR`` of ``config``'s value, best
    # first: a plan sizes them too (the fastest at a replica's share is not always the one
    # that meets the limits with the fewest replicas).
    near: tuple[TrialConfig, ...] = ()


def study_space(loaded: LoadedStudy) -> SearchSpace:
    """The study's search space, as it ran (max-model-len fixed as the run sized it).

    Raises InputError when the study stored none, the file is gone or it changed.
    """
    stored = loaded.info.space
    if not stored.get("path"):
        raise InputError(f"study {loaded.name!r} stored no search space: cannot tune it anew")
    path = loaded.stored_file(str(stored["path"]), "space")
    if not path.is_file():
        raise InputError(f"study {loaded.name!r}: search space {path} is gone")
    space = load_space(path)
    sized = _max_model_len(loaded)
    candidates = [space]
    if sized is not None and MAX_MODEL_LEN_FLAG not in space.fixed:
        candidates.insert(0, _fixed(space, MAX_MODEL_LEN_FLAG, sized))
    digest = stored.get("digest")
    for candidate in candidates:
        if not digest or candidate.digest() == digest:
            return candidate
    raise InputError(f"study {loaded.name!r}: {path} changed since the study ran")


def _max_model_len(loaded: LoadedStudy) -> int | None:
    for row in loaded.trials:
        value = row.flags.get(MAX_MODEL_LEN_FLAG)
        if value is not None:
            return int(value)
    return None


def _fixed(space: SearchSpace, flag: str, value: Any) -> SearchSpace:
    return space.model_copy(update={"fixed": space.fixed | {flag: value}})


def study_goal(loaded: LoadedStudy) -> Goal:
    """The objectives and limits the study scored its trials against."""
    info = loaded.info
    return Goal(
        objectives=[ObjectiveName(name) for name in info.objectives] or [ObjectiveName.THROUGHPUT],
        slos=parse_slos(list(info.slos)),
        max_error_rate=info.max_error_rate or 0.0,
    )


def study_sim_model(loaded: LoadedStudy) -> str:
    """The catalog model the simulator plays for this study (--sim-model, else the model)."""
    options = loaded.study.user_attrs.get("run_options") or {}
    model = options.get("sim_model") or loaded.info.model
    if not model:
        raise InputError(f"study {loaded.name!r} stored no model")
    return str(model)


def _sized_max_model_len(
    space: SearchSpace, plan: WorkloadPlan, *, gpu: str, sim_model: str, goal: Goal
) -> int:
    """max-model-len from the workload's longest request, as `autotune run`'s pre-flight
    sizes it on ``gpu`` (raises PreflightFailed when no config could serve the workload)."""
    model = get_model(sim_model)
    renderer = PromptRenderer(None)
    checked = preflight(
        plan,
        space,
        Target(
            engine="sim",
            model=sim_model,
            sim_model=model,
            hardware=gpu,
            native_context=model.native_max_model_len,
        ),
        count_prompt_tokens=lambda r: len(renderer.render_array(r.system, r.messages, r.endpoint)),
        fixed_max_model_len=None,
        max_error_rate=goal.max_error_rate,
    )
    assert checked.max_model_len is not None  # not fixed: the pre-flight sizes it
    return checked.max_model_len


def _kv_range(space: SearchSpace) -> tuple[float, float] | None:
    for param in space.parameters.values():
        if param.flag == KV_FLAG and isinstance(param, FloatParam) and param.unit == "GiB":
            return param.low, param.high
    return None


def tune_for_gpu(
    loaded: LoadedStudy,
    gpu: str,
    *,
    plan: WorkloadPlan,
    load: LoadSpec,
    calibration: CalibrationProfile | None = None,
    say: Callable[[str], None] | None = None,
) -> TunedForGpu:
    """The study's space tuned for catalog GPU ``gpu`` on the simulator (module docstring).

    ``calibration``: a speed profile for the target's predictions (or None). Raises
    InputError for a space or model the simulator cannot tune.
    """
    if say is not None:
        say(f"{gpu}: tuning {loaded.name!r}'s space on the simulator (predictions, no launch)")
    return tune_space(
        study_space(loaded),
        gpu=gpu,
        model=loaded.info.model or study_sim_model(loaded),
        sim_model=study_sim_model(loaded),
        engine_version=loaded.info.engine_version,
        goal=study_goal(loaded),
        maximize=loaded.info.primary_maximize,
        plan=plan,
        load=load,
        calibration=calibration,
        say=say,
    )


def _near(guide: Guide, best: int) -> list[int]:
    """The replayed configs predicted to meet every limit within ``NEAR`` of ``best``'s
    value, best first, one per distinct prediction, at most ``MOST_NEAR`` (none predicted
    as ``best`` is); ``best``'s
    lattice neighbours are replayed first (one step along a knob: most often the config
    that holds a limit a replica's share puts it near)."""
    assert guide.screened is not None
    guide.settle(lattice_neighbours([c.params for c in guide.candidates])[best])
    value = guide.utility[best]
    if not np.isfinite(value):
        return []
    within = np.flatnonzero((guide.utility >= value + math.log(1 - NEAR)) & ~guide.screened)
    picked: list[int] = []
    seen = {round(float(value), 9)}  # an equal prediction is the same answer
    for index in within[np.argsort(-guide.utility[within], kind="stable")]:
        alike = round(float(guide.utility[index]), 9)
        if alike not in seen and len(picked) < MOST_NEAR:
            seen.add(alike)
            picked.append(int(index))
    return picked


def tune_space(
    space: SearchSpace,
    *,
    gpu: str,
    model: str,
    sim_model: str,
    engine_version: str | None,
    goal: Goal,
    maximize: bool,
    plan: WorkloadPlan,
    load: LoadSpec,
    calibration: CalibrationProfile | None = None,
    cache_path: Path | None = None,
    say: Callable[[str], None] | None = None,
    shortlist: int | None = None,
) -> TunedForGpu:
    """``space`` tuned for catalog GPU ``gpu`` on the simulator: its KV range scaled to the
    card, its whole lattice screened over ``plan`` at ``load`` and the best replayed
    (``tuner/two_tier.py``), the best predicted config that meets ``goal`` (else the
    nearest), and the configs near it (``TunedForGpu.near``).
    ``cache_path``: the disk prediction cache to read and fill (``tuner/prediction_cache.py``);
    ``shortlist``: the two tiers' short list in distinct predictions (None: 2% of the lattice)."""
    if MAX_MODEL_LEN_FLAG not in space.fixed:  # the study did not say: size it as run does
        sized = _sized_max_model_len(space, plan, gpu=gpu, sim_model=sim_model, goal=goal)
        space = _fixed(space, MAX_MODEL_LEN_FLAG, sized)
    longest = max((request.prompt_tokens for request in plan.requests), default=0)
    prescreen = make_prescreen(hardware=gpu, sim_model=sim_model, max_prompt_tokens=longest)
    largest = largest_kv_pool_bytes(
        space, model=model, engine_version=engine_version, prescreen=prescreen
    )
    if largest is not None and _kv_range(space) is not None:
        space = shaped(space, largest)
    oracle = SimOracle(
        hardware=gpu, sim_model=sim_model, plan=plan, load=load, goal=goal, calibration=calibration
    )
    cache = CachedPredictions(oracle, disk=cache_path) if cache_path is not None else None
    try:
        guide = build_guide(
            space,
            model=model,
            engine_version=engine_version,
            prescreen=prescreen,
            oracle=oracle,
            maximize=maximize,
            cache=cache,
            budget_s=WARM_START_BUDGET_S,
            shortlist=shortlist,
            say=say,
        )
        picked = guide.diverse_top(1)  # replayed, where the screen alone scored it
    finally:
        if cache is not None:
            cache.close()
    if not picked:
        raise NoConfigStarts(
            f"no config of the space starts on {gpu} with this workload's longest request "
            f"(max-model-len {space.fixed.get(MAX_MODEL_LEN_FLAG)}; memory model)"
        )
    chosen = picked[0]
    prediction = oracle.predict(chosen.config)
    if prediction is None:
        raise InputError(f"the simulator cannot model {chosen.config.vllm_args()} on {gpu}")
    index = guide.by_key[chosen.key]
    scored = guide.scores[index] if guide.scores else None
    return TunedForGpu(
        gpu=gpu,
        config=chosen.config,
        prediction=prediction,
        meets_limits=bool(scored is not None and scored.feasible),
        configs=len(guide.candidates),
        predicted_feasible=guide.predicted,
        kv_range_gib=_kv_range(space),
        near=tuple(guide.candidates[i].config for i in _near(guide, index)),
    )
