"""From `autotune run` options to a StudySpec: read the inputs once, at the edge."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import ModelSpec, get_model
from autotune.config.known_flags import known_flags
from autotune.config.space import SearchSpace, check_flags, default_space_path, load_space
from autotune.defaults import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_SAMPLER,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_TIME_SCALE,
    DEFAULT_TRIALS,
    default_artifact_dir,
)
from autotune.engines import make_engine
from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.sim.model.calibration_profile import CalibrationProfile, load_profile
from autotune.sim.model.prompt import PromptRenderer
from autotune.study import SAMPLERS, StudySpec, default_study_name, stored_run_options
from autotune.study.trial_length import (
    NO_ORACLE_WHY,
    TrialTimeLimit,
    size_replay,
    size_trial_limit,
)
from autotune.trial.objective import Goal, parse_objectives, parse_slos
from autotune.trial.preflight import (
    MAX_MODEL_LEN_FLAG,
    Preflight,
    PreflightFailed,
    Target,
    check_model_path,
    local_model_endpoints,
    native_context_of,
    preflight,
)
from autotune.trial.prescreen import try_prescreen
from autotune.tuner.predictor import SimOracle
from autotune.tuner.settings import TunerSettings
from autotune.workload import load_plan
from autotune.workload.hf_tokenizer import HfTokenizer
from autotune.workload.plan import PlannedRequest, WorkloadPlan
from autotune.workload.served import (
    WORD_APPROXIMATION_TOKENS,
    find_tokenizer,
    plan_for_model,
    served_prompt_tokens,
)

# Above this memory margin a real engine's config is taken as a certain OOM
# without launching it (the memory model is an estimate for real hardware).
REAL_ENGINE_CERTAIN_OOM_MARGIN = 0.10


class RunOptions(BaseModel):
    """Everything `autotune run` accepts, validated (an unknown field is refused)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    objective: str = "throughput"
    workload: Path
    engine: str = "sim"
    model: str
    hardware: str | None = None  # simulator GPU (catalog name); pre-screen for real engines
    sim_model: str | None = None  # catalog model for the pre-screen of a real engine
    max_model_len: int | None = Field(default=None, ge=1)  # None: sized from the workload
    space: Path | None = None
    storage: str
    study: str | None = None
    trials: int | None = Field(default=DEFAULT_TRIALS, ge=1)
    timeout_s: float | None = None
    trial_timeout_s: float | None = None
    # Not an option: the default trial limit the study's first run sized, kept with its
    # run options so that a resume and its workers use the same (see trial_length.py).
    trial_limit: TrialTimeLimit | None = None
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    sampler: str = DEFAULT_SAMPLER
    slos: list[str] = Field(default_factory=list)
    max_error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    load: LoadSpec = LoadSpec()
    time_scale: float = Field(default=DEFAULT_TIME_SCALE, gt=0)
    noise: float = Field(default=0.0, ge=0)
    vllm_executable: str = "vllm"
    tokenizer: str | None = None  # the served model's tokenizer, when not found from --model
    calibration: Path | None = None  # a profile for the simulator's speed (engine and tuner)
    artifacts_dir: Path | None = None
    heartbeat_interval_s: int = Field(default=DEFAULT_HEARTBEAT_S, ge=1)
    tuner: TunerSettings = TunerSettings()  # the search's settings, its seed and pre-screen
    gpus_per_trial: int = Field(default=1, ge=1)  # the tensor-parallel size


TENSOR_PARALLEL_FLAG = "tensor-parallel-size"


def prepare_study(options: RunOptions, *, say: Callable[[str], None] | None = None) -> StudySpec:
    """Validate and load everything a study needs, pre-flight included (its findings go
    to ``say``); raises InputError subclasses before any study exists."""
    goal = Goal(
        objectives=parse_objectives(options.objective),
        slos=parse_slos(options.slos),
        max_error_rate=options.max_error_rate,
    )
    if options.engine == "sim" and options.hardware is None:
        raise InputError("--hardware is required with --engine sim (e.g. rtx4080s-32g)")
    if options.engine not in ("sim", "vllm"):
        raise InputError(f"--engine: unknown engine {options.engine!r} (known: sim, vllm)")
    if options.sampler not in SAMPLERS:
        raise InputError(
            f"--sampler: unknown sampler {options.sampler!r} (known: {', '.join(SAMPLERS)})"
        )
    if not options.workload.exists():
        raise InputError(f"--workload {options.workload}: no such file")
    space_path = options.space or default_space_path(options.model, options.sim_model)
    space = load_space(space_path)
    check_flags(space, space_path, known_flags(options.engine))
    calibration = _calibration(options)
    token_note = None
    tokenizer_found = False
    sim_tokenizer = None
    if options.engine == "sim":
        # The simulator's own token space, or the served model's tokenizer when given.
        sim_tokenizer = find_tokenizer(options.tokenizer) if options.tokenizer else None
        if options.tokenizer and sim_tokenizer is None:
            raise InputError(
                f"engine.tokenizer: no tokenizer.json found offline for {options.tokenizer!r}"
            )
        plan = load_plan(options.workload, tokenizer=sim_tokenizer)
    else:
        served = plan_for_model(options.workload, model=options.model, tokenizer=options.tokenizer)
        plan, token_note, tokenizer_found = served.plan, served.note, served.tokenizer is not None
    say = say or (lambda _: None)
    try:
        checked = _preflight(
            options, plan, space, _target(options), exact=tokenizer_found, tokenizer=sim_tokenizer
        )
    except PreflightFailed as exc:
        for line in exc.lines:
            say(line)
        raise
    for line in checked.lines:
        say(line)
    if checked.max_model_len is not None:
        space = space.model_copy(
            update={"fixed": space.fixed | {MAX_MODEL_LEN_FLAG: checked.max_model_len}}
        )
    if options.gpus_per_trial > 1:
        if options.engine == "sim":
            raise InputError(
                f"--gpus-per-trial {options.gpus_per_trial}: the simulator models one GPU per "
                "server; use --gpus-per-trial 1 with --engine sim"
            )
        space = space.model_copy(
            update={"fixed": space.fixed | {TENSOR_PARALLEL_FLAG: options.gpus_per_trial}}
        )
    longest = max((request.prompt_tokens for request in plan.requests), default=0)
    no_oracle_why = NO_ORACLE_WHY
    if options.engine == "sim":
        extra_args = ("--tokenizer", options.tokenizer) if options.tokenizer else ()
        if options.calibration is not None:
            extra_args += ("--calibration", str(options.calibration.resolve()))
        engine = make_engine(
            "sim",
            hardware=options.hardware,
            time_scale=options.time_scale,
            seed=options.tuner.seed or 0,
            noise=options.noise,
            sim_model=options.sim_model,
            extra_args=extra_args,
        )
        prescreen = try_prescreen(
            hardware=options.hardware,
            sim_model=options.sim_model or options.model,
            certain_above=0.0,
            max_prompt_tokens=longest,
        )
        gpu = options.hardware
        oracle = try_oracle(
            options.hardware,
            options.sim_model or options.model,
            plan,
            options.load,
            goal,
            calibration=calibration,
        )
    else:
        engine = make_engine("vllm", executable=options.vllm_executable)
        prescreen = try_prescreen(
            hardware=options.hardware,
            sim_model=options.sim_model,
            certain_above=REAL_ENGINE_CERTAIN_OOM_MARGIN,
            max_prompt_tokens=longest,
        )
        oracle = try_oracle(
            options.hardware, options.sim_model, plan, options.load, goal, calibration=calibration
        )
        if options.gpus_per_trial > 1 and prescreen is not None:
            say("note: no memory pre-screen with --gpus-per-trial above 1 (it models one GPU)")
            prescreen = oracle = None
            no_oracle_why = "the simulator models one GPU, not --gpus-per-trial above 1"
        gpu = options.hardware or engine.hardware().gpu_name.replace(" ", "-").lower()
    load, length_line = size_replay(
        options.load,
        plan,
        space=space,
        model=options.model,
        engine_version=engine.version() if options.engine == "sim" else None,
        oracle=oracle,
    )
    if length_line:
        say(length_line)
    if oracle is not None:
        oracle = dataclasses.replace(oracle, load=load)
    name = options.study or default_study_name(
        options.model, gpu, plan.name, [o.value for o in goal.objectives]
    )
    # The default limit: the study's own when it has one (a resume, a worker), else sized.
    stored_limit = options.trial_limit or _stored_trial_limit(options.storage, name)
    default_limit = stored_limit
    if default_limit is None:  # sized even under --trial-timeout: the ETA reads its length
        default_limit = size_trial_limit(
            load,
            plan,
            space=space,
            model=options.model,
            engine_version=engine.version() if options.engine == "sim" else None,
            oracle=oracle,
            time_scale=options.time_scale if options.engine == "sim" else 1.0,
            no_oracle_why=no_oracle_why,
        )
    limit = _limit_in_effect(options.trial_timeout_s, default_limit)
    say(limit.line(stored=stored_limit is not None and limit == stored_limit))
    artifacts = options.artifacts_dir or default_artifact_dir(options.storage)
    return StudySpec(
        name=name,
        storage_url=options.storage,
        space=space,
        space_path=space_path,
        goal=goal,
        model=options.model,
        engine=engine,
        plan=plan,
        token_note=token_note,
        workload_path=options.workload,
        load=load,
        n_trials=options.trials,
        timeout_s=options.timeout_s,
        trial_timeout_s=None if limit.from_ready else limit.seconds,
        replay_timeout_s=limit.seconds if limit.from_ready else None,
        replay_wall_s=default_limit.replay_wall_s,
        startup_timeout_s=options.startup_timeout_s,
        sampler=options.sampler,
        seed=options.tuner.seed,
        prescreen=prescreen,
        skip_predicted_oom=options.tuner.prescreen,
        artifacts_dir=artifacts,
        runs_dir=artifacts.parent / "runs",
        heartbeat_interval_s=options.heartbeat_interval_s,
        tuner=options.tuner,
        oracle=oracle,
        calibration=calibration,
        run_options=options.model_copy(
            update={
                "workload": options.workload.resolve(),
                "space": space_path.resolve(),
                "trial_limit": default_limit,
            }
        ).model_dump(mode="json", exclude={"storage", "study"}),
    )


def _limit_in_effect(trial_timeout_s: float | None, default: TrialTimeLimit) -> TrialTimeLimit:
    """--trial-timeout (on the whole trial, start included) when given, else the default."""
    if trial_timeout_s is not None:
        return TrialTimeLimit(seconds=trial_timeout_s, from_ready=False, basis="--trial-timeout")
    return default


def _stored_trial_limit(storage: str, name: str) -> TrialTimeLimit | None:
    """The default trial limit study ``name`` was run with, when it exists and stored one."""
    stored = stored_run_options(storage, name) or {}
    limit = stored.get("trial_limit")
    return TrialTimeLimit.model_validate(limit) if limit else None


def _calibration(options: RunOptions) -> CalibrationProfile | None:
    """The calibration profile (``simulator.calibration``), checked against the GPU and
    model it will predict."""
    if options.calibration is None:
        return None
    profile = load_profile(options.calibration)
    sim_model = options.sim_model or (options.model if options.engine == "sim" else None)
    if options.hardware is None or sim_model is None:
        raise InputError(
            "simulator.calibration: the simulator's predictions need --hardware and --sim-model "
            "with a real engine"
        )
    profile.check_fitted_for(options.hardware, sim_model)
    return profile


def _target(options: RunOptions) -> Target:
    """The model and hardware the workload will meet; unknown names are bad input."""
    if options.engine == "sim":
        sim_model = _sim_model(options)
        if options.hardware is not None:
            get_gpu(options.hardware)
        return Target(
            engine="sim",
            model=options.model,
            sim_model=sim_model,
            hardware=options.hardware,
            native_context=sim_model.native_max_model_len,
        )
    check_model_path(options.model)
    sim_model = get_model(options.sim_model) if options.sim_model else None
    if options.hardware is not None:
        get_gpu(options.hardware)
    return Target(
        engine=options.engine,
        model=options.model,
        sim_model=sim_model,
        hardware=options.hardware,
        served_endpoints=local_model_endpoints(options.model),
        # vLLM serves past the native context when told to (its own environment variable).
        native_context=None
        if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1"
        else native_context_of(options.model, sim_model),
    )


def _sim_model(options: RunOptions) -> ModelSpec:
    """The catalog model the simulator runs: --sim-model, else --model itself."""
    if options.sim_model is not None:
        return get_model(options.sim_model)
    try:
        return get_model(options.model)
    except InputError as exc:
        raise InputError(
            f"{exc}; to name the model you will serve (a path or id), add --sim-model NAME"
        ) from None


def _preflight(
    options: RunOptions,
    plan: WorkloadPlan,
    space: SearchSpace,
    target: Target,
    *,
    exact: bool,
    tokenizer: HfTokenizer | None = None,
) -> Preflight:
    """The pre-flight in the engine's own prompt count: the simulator's renderer, or for
    a real engine the served model's tokenizer plus its chat template (estimated), or the
    word approximation's range of real-token costs when no tokenizer is here."""
    fixed = options.max_model_len or space.fixed.get(MAX_MODEL_LEN_FLAG)
    if options.engine == "sim":
        renderer = PromptRenderer(tokenizer)

        def count(request: PlannedRequest) -> int:
            return len(renderer.render_array(request.system, request.messages, request.endpoint))

        counter, estimate = count, None
    else:
        counter = served_prompt_tokens
        estimate = None if exact else WORD_APPROXIMATION_TOKENS
    return preflight(
        plan,
        space,
        target,
        count_prompt_tokens=counter,
        tokens_per_counted=estimate,
        fixed_max_model_len=int(fixed) if fixed is not None else None,
        max_error_rate=options.max_error_rate,
    )


def try_oracle(
    hardware: str | None,
    sim_model: str | None,
    plan: WorkloadPlan,
    load: LoadSpec,
    goal: Goal,
    *,
    calibration: CalibrationProfile | None = None,
) -> SimOracle | None:
    """The simulator's predictor for the guided search, when both names are in its catalogs."""
    if hardware is None or sim_model is None:
        return None
    try:
        get_gpu(hardware)
        get_model(sim_model)
    except InputError:
        return None
    return SimOracle(
        hardware=hardware,
        sim_model=sim_model,
        plan=plan,
        load=load,
        goal=goal,
        calibration=calibration,
    )
