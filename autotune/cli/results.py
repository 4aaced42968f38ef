"""Commands on finished studies: export, compare, report, explain, dashboard."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Annotated

import optuna
import typer

from autotune.catalog.prices import parse_prices
from autotune.catalog.provenance import provenance_line
from autotune.cli._common import (
    StorageOption,
    StudyOption,
    console,
    error_console,
    handle_errors,
)
from autotune.defaults import DEFAULT_STORAGE_URL
from autotune.errors import InputError
from autotune.results import compare as compare_mod
from autotune.results import export as export_mod
from autotune.results.explain import explain as explain_study
from autotune.results.reader import dashboard_argv, load_study
from autotune.sim.model.calibration_profile import load_profile


@handle_errors
def export(
    storage: StorageOption = DEFAULT_STORAGE_URL,
    study: StudyOption = None,
    trial: Annotated[
        int | None, typer.Option("--trial", help="Export this trial number, not the best.")
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="shell (a vllm serve line), yaml (--config), json.")
    ] = "shell",
    out: Annotated[
        Path | None, typer.Option("--out", help="Write to this file instead of stdout.")
    ] = None,
    slo: Annotated[
        list[str] | None,
        typer.Option("--slo", help="Pick the best trial meeting this SLO, e.g. ttft_p95<=2s."),
    ] = None,
) -> None:
    """Export the best configuration (or --trial N) as a command, a YAML config, or JSON."""
    _quiet_optuna()
    if fmt not in export_mod.EXPORT_FORMATS:
        raise InputError(
            f"--format {fmt!r}: expected one of {', '.join(export_mod.EXPORT_FORMATS)}"
        )
    if trial is not None and slo:
        raise InputError("--trial and --slo choose a trial in two ways: give one of them")
    loaded = load_study(storage, study)
    row = export_mod.select_trial(loaded, number=trial, slos=slo)
    text = export_mod.render(loaded, row, fmt)  # type: ignore[arg-type]  # checked above
    if out is None:
        typer.echo(text, nl=False)
        return
    if fmt == "yaml" and out.suffix not in (".yaml", ".yml"):
        raise InputError(f"--out {out}: vllm serve --config needs a .yaml or .yml file")
    out.write_text(text)
    error_console().print(f"wrote {out} (trial {row.number} of study {loaded.name!r})")


@handle_errors
def explain(storage: StorageOption = DEFAULT_STORAGE_URL, study: StudyOption = None) -> None:
    """Explain, from the measured trials, why the best config wins and where OOM begins."""
    _quiet_optuna()
    loaded = load_study(storage, study)
    out = console()
    out.print(f"[bold]Study {loaded.name}[/bold]: {loaded.info.model} on {loaded.info.gpu_name}")
    for section in explain_study(loaded):
        out.print(f"\n[bold]{section.title}[/bold]")
        for sentence in section.sentences:
            out.print(f"  {sentence}", highlight=False)


@handle_errors
def report(
    storage: StorageOption = DEFAULT_STORAGE_URL,
    study: StudyOption = None,
    out: Annotated[Path, typer.Option("--out", help="The HTML file to write.")] = Path(
        "report.html"
    ),
) -> None:
    """Write a self-contained HTML report (plots inlined; opens with no network)."""
    _quiet_optuna()
    loaded = load_study(storage, study)
    from autotune.results.report import (
        render_report,  # plotly and Optuna's plots: this command only
    )

    out.write_text(render_report(loaded))
    console().print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) for study {loaded.name!r}")


@handle_errors
def compare(
    studies: Annotated[list[str], typer.Argument(help="Study names to compare.")],
    storage: StorageOption = DEFAULT_STORAGE_URL,
    price: Annotated[
        list[str] | None,
        typer.Option("--price", help="GPU=USD_PER_HOUR, e.g. rtx4080s-32g=0.35 (repeatable)."),
    ] = None,
    what_if: Annotated[
        list[str] | None,
        typer.Option(
            "--what-if",
            help="Also tune the study's space for this simulator GPU (repeatable; "
            "predictions only) and show the config it picks, calibrated on the study's own GPU.",
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            "--calibration",
            help="Calibration profile (autotune sim calibrate) for --what-if predictions.",
        ),
    ] = None,
) -> None:
    """One table across studies: best config, throughput, latency, KV tokens, tok/s per $."""
    _quiet_optuna()
    prices = parse_prices(price or [])
    loaded = [load_study(storage, name) for name in studies]
    rows = compare_mod.compare_rows(loaded, prices=prices)
    if what_if:
        profile = None if calibration is None else load_profile(calibration)
        out = console()
        rows += compare_mod.what_if_rows(
            loaded,
            what_if,
            prices=prices,
            calibration=profile,
            say=lambda line: out.print(line, highlight=False, markup=False, soft_wrap=True),
        )
        for gpu in what_if:  # how far each what-if GPU's speed was held to published runs
            out.print(provenance_line(gpu), highlight=False, markup=False, soft_wrap=True)
    console().print(compare_mod.comparison_table(rows))


@handle_errors
def dashboard(
    storage: StorageOption = DEFAULT_STORAGE_URL,
    artifact_dir: Annotated[
        Path | None,
        typer.Option(
            "--artifact-dir",
            help="Where trial artifacts (logs, CSVs) live (default: beside the SQLite file).",
        ),
    ] = None,
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1.")] = 8080,
    print_only: Annotated[
        bool, typer.Option("--print", help="Print the command instead of running it.")
    ] = False,
) -> None:
    """Open the studies in optuna-dashboard (server logs and request CSVs as artifacts)."""
    _quiet_optuna()
    argv = dashboard_argv(storage, artifact_dir=artifact_dir, port=port)
    if print_only:
        typer.echo(shlex.join(argv))
        return
    error_console().print(f"running: {shlex.join(argv)}  (open http://127.0.0.1:{port}/dashboard/)")
    raise typer.Exit(subprocess.call(argv))


def _quiet_optuna() -> None:
    """Our commands print their own output; Optuna's INFO lines would interleave."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    app.command()(export)
    app.command()(compare)
    app.command()(report)
    app.command()(explain)
    app.command()(dashboard)
