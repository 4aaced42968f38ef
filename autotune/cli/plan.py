"""`autotune plan`: which GPU, how many, at what cost, for a workload at a target load."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.catalog.prices import default_prices, parse_prices, price_for
from autotune.catalog.provenance import provenance_line
from autotune.cli._common import StorageOption, console, handle_errors
from autotune.config.known_flags import VLLM_FLAGS_VERSION
from autotune.config.space import default_space_path, load_space
from autotune.defaults import DEFAULT_STORAGE_URL
from autotune.errors import InputError
from autotune.fleet.candidates import Candidate, PlanInputs, plan_gpu, rank
from autotune.fleet.deploy import write_deploy
from autotune.fleet.inputs import check_prices, check_sessions, check_tp_sizes
from autotune.fleet.report import plan_html, plan_lines, plan_table, why_lost
from autotune.fleet.routing import describe
from autotune.replay.load import LoadSpec
from autotune.sim.model.calibration_profile import CalibrationProfile, load_profile
from autotune.trial.objective import Goal, ObjectiveName, parse_slos
from autotune.tuner.prediction_cache import default_cache_path
from autotune.workload.expand import load_plan
from autotune.workload.plan import WorkloadPlan

DEFAULT_GPUS = ("rtx4090-24g", "l40s-48g", "h100-80g", "h200-141g")


def target_load(
    plan: WorkloadPlan, sessions: int | None, speedup: float | None, rate_rps: float | None
) -> LoadSpec:
    """The target load from exactly one of --sessions, --speedup and --rate."""
    given = [
        name
        for name, value in (("--sessions", sessions), ("--speedup", speedup), ("--rate", rate_rps))
        if value is not None
    ]
    if len(given) != 1:
        raise InputError("give the target load as one of --sessions N, --speedup X, --rate RPS")
    if sessions is not None:
        if not plan.sessions:
            raise InputError(f"{plan.name}: --sessions needs a workload of sessions")
        check_sessions(plan, sessions)
        return LoadSpec(mode="sessions", concurrency=sessions)
    if speedup is not None:
        return LoadSpec(mode="trace", timing_scale=speedup, max_gap_s=None)
    arrivals = [request.arrival_s for request in plan.requests]
    span_s = max(arrivals) - min(arrivals)
    if span_s <= 0:
        raise InputError(f"{plan.name}: --rate needs recorded arrivals spread over time")
    recorded_rps = (len(arrivals) - 1) / span_s
    assert rate_rps is not None
    return LoadSpec(mode="trace", timing_scale=rate_rps / recorded_rps, max_gap_s=None)


def _study_profile(storage: str, name: str, sim_model: str) -> CalibrationProfile:
    """A speed profile fitted to a study's measured trials (as `autotune sim calibrate`)."""
    from autotune.calibration.fit import calibrate
    from autotune.calibration.from_study import study_targets
    from autotune.results.reader import load_study
    from autotune.results.study_inputs import catalog_gpu

    loaded = load_study(storage, name)
    hardware = catalog_gpu(loaded)
    targets = study_targets(loaded, hardware=hardware, model=sim_model)
    return calibrate(
        targets,
        hardware=hardware,
        model=sim_model,
        source=f"study {loaded.name}",
        engine_version=loaded.info.engine_version,
        workload_digest=targets[0].plan.digest,
        cross_validate=False,
    )


def calibration_errors(profile: CalibrationProfile) -> tuple[float, float] | None:
    """The median absolute throughput error over the profile's measured points: before
    and after the calibration (None: no point to compare)."""
    pairs = [
        (
            abs(p.uncalibrated_tok_s / p.measured_tok_s - 1),
            abs(p.calibrated_tok_s / p.measured_tok_s - 1),
        )
        for p in profile.points
        if p.uncalibrated_tok_s and p.calibrated_tok_s and p.measured_tok_s
    ]
    if not pairs:
        return None
    before, after = (sorted(side)[len(side) // 2] for side in zip(*pairs, strict=True))
    return before, after


def calibration_note(profile: CalibrationProfile) -> str:
    """How far the calibration moved the predictions toward the measurements."""
    errors = calibration_errors(profile)
    if errors is None:
        return f"calibration {profile.name}: no measured point to compare"
    return (
        f"calibrated on {profile.hardware} ({profile.name}, {len(profile.points)} measured "
        f"points): median throughput error {errors[0]:.1%} uncalibrated -> {errors[1]:.1%} "
        "calibrated"
    )


@handle_errors
def plan(
    workload: Annotated[Path, typer.Argument(help="The workload (JSONL) the fleet serves.")],
    model: Annotated[
        str,
        typer.Option(
            "--model", help="Model catalog name, or the path or id to deploy (then --sim-model)."
        ),
    ],
    slo: Annotated[
        list[str],
        typer.Option("--slo", help="A limit every fleet meets, e.g. ttft_p95<=3s (repeatable)."),
    ],
    sessions: Annotated[
        int | None,
        typer.Option(
            "--sessions", min=1, help="Target load: this many sessions at once over the fleet."
        ),
    ] = None,
    speedup: Annotated[
        float | None,
        typer.Option(
            "--speedup", min=0.001, help="Target load: the recorded trace this many times faster."
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate", min=0.001, help="Target load: the trace sped up to this many requests/s."
        ),
    ] = None,
    gpu: Annotated[
        list[str] | None,
        typer.Option(
            "--gpu",
            help=f"A catalog GPU to consider (repeatable; default {', '.join(DEFAULT_GPUS)}).",
        ),
    ] = None,
    tp: Annotated[
        list[int] | None,
        typer.Option(
            "--tp", min=1, help="Tensor-parallel sizes to consider (repeatable; default 1)."
        ),
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option(
            "--price",
            help="GPU=USD_PER_HOUR per GPU, "
            "over the catalog's defaults (autotune/catalog/data/prices.yaml).",
        ),
    ] = None,
    sim_model: Annotated[
        str | None,
        typer.Option("--sim-model", help="The catalog model to simulate when --model is a path."),
    ] = None,
    space: Annotated[
        Path | None,
        typer.Option("--space", help="Search space (default: the model's in search_spaces/)."),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            "--calibration",
            help="A speed profile (autotune sim calibrate) for its GPU's predictions.",
        ),
    ] = None,
    study: Annotated[
        str | None,
        typer.Option(
            "--study",
            help="Correct the simulator on its GPU with this measured study (a fit of its trials).",
        ),
    ] = None,
    storage: StorageOption = DEFAULT_STORAGE_URL,
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Folder for plan.json, plan.html and the winner's deploy files."
        ),
    ] = Path("plan"),
) -> None:
    """Plan a fleet: the cheapest GPU kind and replica count that meets the SLOs at a load."""
    started = time.monotonic()
    sim_name = sim_model or model
    model_spec = get_model(sim_name)
    gpus = list(gpu or DEFAULT_GPUS)
    for name in gpus:
        get_gpu(name)
    tp_sizes = sorted(set(tp or [1]))
    check_tp_sizes(model_spec, tp_sizes)
    if calibration is not None and study is not None:
        raise InputError("give one of --calibration and --study")
    given_prices = parse_prices(price or [])
    check_prices(price or [], gpus)
    workload_plan = load_plan(workload)
    load = target_load(workload_plan, sessions, speedup, rate)
    goal = Goal(objectives=[ObjectiveName.THROUGHPUT], slos=parse_slos(slo))
    space_path = space or default_space_path(model, sim_model)
    profile = load_profile(calibration) if calibration is not None else None
    if study is not None:
        profile = _study_profile(storage, study, sim_name)
    inputs = PlanInputs(
        plan=workload_plan,
        load=load,
        goal=goal,
        space=load_space(space_path),
        model=model,
        sim_model=sim_name,
        engine_version=VLLM_FLAGS_VERSION,
        calibration=profile,
        cache_path=default_cache_path(storage),
    )
    out_console = console()
    say = out_console.print
    candidates: list[Candidate] = []
    for name in gpus:
        usd = price_for(given_prices, name)  # the user's over the defaults, even inexact
        if usd is None:
            usd = price_for(default_prices(), name)
        if usd is None:
            raise InputError(f"--gpu {name}: no price; give --price {name}=USD_PER_HOUR")
        for size in tp_sizes:
            others = [c.config for c in candidates if c.config is not None]
            candidates.append(plan_gpu(inputs, name, usd, say, tp=size, others=others))
    ranked = rank(candidates)
    limits = ", ".join(limit.text for limit in goal.slos)
    title = f"{sim_name}: {workload_plan.name} at {describe(load)}, {limits}"
    notes = [
        "router: sessions round robin over the replicas (session k -> replica k mod R); "
        "each config tuned on the simulator over its whole lattice (every config screened, "
        "the best 2% and their neighbours replayed)",
        "headroom: the target load times this still meets every limit (>=: the most tried)",
    ]
    if profile is not None:
        notes.append(calibration_note(profile))
    notes += [provenance_line(name) for name in gpus]  # each GPU's speed, held to published runs
    out_console.print(plan_table(ranked, title))
    for note in [*plan_lines(ranked), *notes]:
        say(note)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.html").write_text(plan_html(ranked, title, notes))
    record = plan_record(ranked, load, slo, model)
    errors = calibration_errors(profile) if profile is not None else None
    if errors is not None:
        record["calibration"] = {"uncalibrated_error": errors[0], "calibrated_error": errors[1]}
    (out / "plan.json").write_text(json.dumps(record, indent=2))
    winner = ranked[0]
    if winner.replicas is None or winner.config is None:
        say(f"no GPU kind meets the limits at this load; wrote {out / 'plan.html'}")
        raise typer.Exit(1)
    written = write_deploy(
        out,
        winner.config,
        model=model,
        replicas=winner.replicas,
        tp=winner.tp,
        name=f"vllm-{winner.gpu}",
    )
    say(
        f"plan: {winner.replicas} x {winner.gpu} at ${winner.usd_per_hour:,.2f}/hour; wrote "
        f"{', '.join(str(p) for p in [out / 'plan.html', out / 'plan.json', *written])} "
        f"in {time.monotonic() - started:.0f} s"
    )


def plan_record(ranked: list[Candidate], load: LoadSpec, slos: list[str], model: str) -> dict:
    """plan.json: the load, the limits and every candidate, the winner first, with the
    configs weighed for it and why it lost."""
    winner = ranked[0] if ranked and ranked[0].replicas is not None else None
    rows = []
    for candidate in ranked:
        stats = candidate.fleet.stats if candidate.fleet else None
        rows.append(
            {
                "gpu": candidate.gpu,
                "tp": candidate.tp,
                "replicas": candidate.replicas,
                "gpus": candidate.gpus,
                "usd_per_gpu_hour": candidate.usd_per_gpu_hour,
                "usd_per_hour": candidate.usd_per_hour,
                "output_tok_s": candidate.output_tok_s,
                "usd_per_million_output_tokens": candidate.usd_per_million_tokens,
                "ttft_p95_s": stats.ttft.p95 if stats else None,
                "tpot_p95_s": stats.tpot.p95 if stats else None,
                "margins": candidate.fleet.margins if candidate.fleet else None,
                "headroom": candidate.headroom,
                "breaks_on": candidate.breaks_on,
                "binding": candidate.binding,
                "calibrated": candidate.calibrated,
                "configs_considered": candidate.configs_considered,
                "lost_because": why_lost(candidate, winner),
                "argv": candidate.config.vllm_args() if candidate.config else None,
                "config": candidate.config.model_dump() if candidate.config else None,
            }
        )
    return {"model": model, "load": load.model_dump(), "slos": slos, "candidates": rows}


def register(app: typer.Typer) -> None:
    """Add this module's command to the root app."""
    app.command()(plan)
