"""`autotune sim calibrate`: fit the simulator's speed constants to measurements."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from autotune.calibration.points import load_points
from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.cli._common import StorageOption, console, handle_errors
from autotune.defaults import DEFAULT_STORAGE_URL
from autotune.errors import InputError
from autotune.results.reader import load_study
from autotune.results.study_inputs import catalog_gpu
from autotune.sim.model.calibration_profile import CalibrationProfile, save_profile
from autotune.sim.model.speed_constants import DEFAULT_CONSTANTS

if TYPE_CHECKING:
    from autotune.calibration.fit import Target


@handle_errors
def calibrate_command(
    out: Annotated[Path, typer.Option("--out", help="Where to write the profile (YAML).")],
    hardware: Annotated[
        str | None, typer.Option("--hardware", help="GPU catalog name (default: the study's).")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Model catalog name (default: the study's).")
    ] = None,
    points: Annotated[
        Path | None,
        typer.Option("--points", help="Measured closed-loop points (JSON; docs/simulator.md)."),
    ] = None,
    from_study: Annotated[
        str | None,
        typer.Option("--from-study", help="Calibrate from this study's measured trials."),
    ] = None,
    storage: StorageOption = DEFAULT_STORAGE_URL,
    cross_validate: Annotated[
        bool,
        typer.Option(
            "--cross-validate/--no-cross-validate",
            help="Estimate the expected error on held-out points (refits per fold).",
        ),
    ] = True,
) -> None:
    """Fit bandwidth/compute efficiency, overheads, draft cost and MTP acceptance to runs."""
    # scipy.optimize takes 0.4 s to import: this command only, not every autotune start.
    from autotune.calibration.fit import calibrate, point_target
    from autotune.calibration.from_study import study_targets

    if (points is None) == (from_study is None):
        raise InputError("give exactly one of --points FILE and --from-study NAME")
    if points is not None:
        if hardware is None or model is None:
            raise InputError("--points needs --hardware and --model (catalog names)")
        get_gpu(hardware)
        get_model(model)
        targets = [point_target(hardware, model, point) for point in load_points(points)]
        profile = calibrate(
            targets,
            hardware=hardware,
            model=model,
            source=str(points),
            cross_validate=cross_validate,
        )
    else:
        loaded = load_study(storage, from_study)
        hardware = hardware or catalog_gpu(loaded)
        model = model or loaded.info.model or ""
        get_gpu(hardware)
        get_model(model)
        targets = study_targets(loaded, hardware=hardware, model=model)
        profile = calibrate(
            targets,
            hardware=hardware,
            model=model,
            source=f"study {loaded.name}",
            engine_version=loaded.info.engine_version,
            workload_digest=targets[0].plan.digest,
            cross_validate=cross_validate,
        )
    save_profile(profile, out)
    _print_profile(profile, targets)
    console().print(f"wrote {out}")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _print_profile(profile: CalibrationProfile, targets: list[Target]) -> None:
    from autotune.calibration.fit import EVIDENCE, NOISE

    table = Table(title=f"calibration: {profile.model} on {profile.hardware} ({profile.source})")
    table.add_column("point")
    for column in ("tok/s", "raw", "fit", "held out", "latency s", "raw", "fit", "held out"):
        table.add_column(column, justify="right")
    for point in profile.points:
        tok_error, latency_error = point.errors
        held_tok, held_latency = point.held_out_errors
        table.add_row(
            point.label,
            f"{point.measured_tok_s:.1f}",
            _percent(
                point.uncalibrated_tok_s and point.uncalibrated_tok_s / point.measured_tok_s - 1
            ),
            _percent(tok_error),
            _percent(held_tok),
            f"{point.measured_latency_s:.3f}",
            _percent(
                point.uncalibrated_latency_s
                and point.uncalibrated_latency_s / point.measured_latency_s - 1
            ),
            _percent(latency_error),
            _percent(held_latency),
        )
    out = console()
    out.print(table)
    out.print("raw: uncalibrated model; fit: calibrated; held out: fitted without that point")
    within_noise = profile.catalog_p_value is not None and profile.catalog_p_value >= EVIDENCE
    if within_noise:
        out.print(
            f"the catalog kept: its errors on these points are within measurement noise "
            f"(p = {profile.catalog_p_value:.2f} at {NOISE:.0%} a figure; a fit would chase it)"
        )
    elif profile.cross_validation:
        tried = ", ".join(f"{key} {error:.1%}" for key, error in profile.cross_validation.items())
        chosen = (
            "the catalog kept"
            if profile.prior_weight is None
            else (f"prior weight {profile.prior_weight:g}")
        )
        out.print(f"held-out median error by prior weight: {tried}; {chosen}")
    for name in profile.fitted:
        before = getattr(DEFAULT_CONSTANTS, name)
        after = getattr(profile.constants, name)
        if name == "mtp_acceptance":
            before = tuple(round(rate, 3) for rate in before or ()) or "catalog"
            out.print(f"  {name}: {before} -> {tuple(round(rate, 3) for rate in after or ())}")
            continue
        moved = f" ({after / before - 1:+.1%})" if before else ""
        out.print(f"  {name}: {before or 'catalog'} -> {after:.4g}{moved}")
    if profile.expected_error is not None:
        out.print(
            f"expected error: {profile.expected_error:.1%} "
            f"(median over {len(targets)} points, {profile.expected_error_basis})"
        )
