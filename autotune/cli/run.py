"""`autotune run`, `try`, `show` and `studies`: the study loop's commands."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from autotune.cli._common import (
    LOAD_DEFAULTS,
    StorageOption,
    StudyOption,
    console,
    error_console,
    handle_errors,
    option_error,
    parse_duration,
)
from autotune.cli._run_output import (
    RunOutput,
    best_so_far,
    resume_line,
    summary_lines,
    trials_table,
)
from autotune.cli.progress import Tally
from autotune.cli.show_table import print_show
from autotune.config.space import default_space_path
from autotune.defaults import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_SAMPLER,
    DEFAULT_STORAGE_URL,
    DEFAULT_TRIALS,
)
from autotune.engines import kill_all_servers
from autotune.errors import InputError
from autotune.results.reader import LoadedStudy, load_study, study_names
from autotune.study import StudySpec, completed_count, completed_trials, run_log_path, run_study
from autotune.study.between_trials import redeliver_swallowed_interrupts
from autotune.study.setup import RunOptions, prepare_study
from autotune.study.verdict import stored_verdict
from autotune.study.workers import gpu_groups, refuse_sqlite, run_workers
from autotune.trial.objective import METRIC_NAMES, ObjectiveName
from autotune.tuner.kv_bounds import kv_bound_warning
from autotune.tuner.settings_file import read_run_settings

FINAL_TABLE_ROWS = 5  # the best trials a run on a terminal ends with

Workload = Annotated[Path, typer.Option("--workload", "-w", help="Workload JSONL file.")]
Mode = Annotated[
    str,
    typer.Option(
        "--mode",
        help="Load: sessions (each session's turns in order), concurrency (N requests in "
        "flight) or trace (the recorded arrival times).",
    ),
]


def register(app: typer.Typer) -> None:
    """Add run, try, show and studies to the root app."""
    app.command("run")(run)
    app.command("show")(show)
    app.command("studies")(studies)


@handle_errors
def run(
    workload: Workload,
    model: Annotated[
        str,
        typer.Option(
            "--model", help="Model: a simulator catalog name (sim), or the path or id vllm serves."
        ),
    ],
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="throughput (output tok/s), goodput (requests/s within the SLOs), latency "
            "(p95 end-to-end s), or a comma list for a Pareto study.",
        ),
    ] = "throughput",
    engine: Annotated[
        str, typer.Option("--engine", help="sim (the built-in simulator) or vllm.")
    ] = "sim",
    hardware: Annotated[
        str | None,
        typer.Option(
            "--hardware",
            help="GPU catalog name (autotune sim catalog): the simulated GPU; with vllm, the "
            "memory pre-screen's.",
        ),
    ] = None,
    sim_model: Annotated[
        str | None,
        typer.Option(
            "--sim-model",
            help="Catalog model the simulator stands in for when --model is a path or id "
            "(pre-screen, warm start).",
        ),
    ] = None,
    space: Annotated[
        Path | None,
        typer.Option(
            "--space",
            help="Search-space YAML (default: search_spaces/<model>.yaml, else default.yaml).",
        ),
    ] = None,
    tuner: Annotated[
        Path | None,
        typer.Option(
            "--tuner",
            help="YAML of the tuner's settings and the load, simulator and engine details "
            "(docs/tuner.md); its keys win over the space's tuner: section.",
        ),
    ] = None,
    trials: Annotated[
        int,
        typer.Option(
            "--trials", help="Trials to complete (launches, re-measurements, predicted OOMs)."
        ),
    ] = DEFAULT_TRIALS,
    timeout: Annotated[
        str | None,
        typer.Option("--timeout", help="Wall time for the whole run, e.g. 8h (default: none)."),
    ] = None,
    trial_timeout: Annotated[
        str | None,
        typer.Option("--trial-timeout", help="Wall time for one trial, e.g. 30m (default: none)."),
    ] = None,
    storage: StorageOption = DEFAULT_STORAGE_URL,
    study: StudyOption = None,
    sampler: Annotated[
        str,
        typer.Option(
            "--sampler",
            help="guided (the simulator steers), or Optuna's gp, tpe, random or grid.",
        ),
    ] = DEFAULT_SAMPLER,
    slo: Annotated[
        list[str] | None,
        typer.Option(
            "--slo",
            help="A limit the winner must meet, METRIC_STAT<=VALUE: ttft, tpot, itl or e2e; "
            "mean, p50, p90, p95 or p99; in ms, s or m; e.g. ttft_p95<=2s (repeatable).",
        ),
    ] = None,
    max_error_rate: Annotated[
        float,
        typer.Option("--max-error-rate", help="Share of failed requests a trial may have, 0 to 1."),
    ] = 0.0,
    mode: Mode = LOAD_DEFAULTS.mode,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency", help="Sessions (sessions mode) or requests (concurrency) in flight."
        ),
    ] = LOAD_DEFAULTS.concurrency,
    duration: Annotated[
        str | None,
        typer.Option(
            "--duration",
            help="Replay budget of each trial, e.g. 10m (default: the whole workload, capped "
            "at 10m when predicted over 20m).",
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="GPU ids, e.g. 0,1,2,3: one worker per group of --gpus-per-trial "
            "(PostgreSQL storage).",
        ),
    ] = None,
    gpus_per_trial: Annotated[
        int, typer.Option("--gpus-per-trial", help="GPUs per server (its tensor-parallel size).")
    ] = 1,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed",
            help="Seed of the sampler and the simulator: reproducible proposals (the tuner "
            "setting seed:); each worker draws its own stream from it.",
        ),
    ] = None,
    heartbeat_interval: Annotated[
        int, typer.Option("--heartbeat-interval", hidden=True)
    ] = DEFAULT_HEARTBEAT_S,
) -> None:
    """Tune: propose configs, launch, replay, score; resume by running the same command again.

    The tuner's settings and the rarely changed load, simulator and engine details are
    keys of the space's tuner: section or of --tuner FILE (docs/tuner.md).
    """
    groups = gpu_groups(gpus, gpus_per_trial)
    if len(groups) > 1:
        refuse_sqlite(storage, f"--gpus {gpus} (--gpus-per-trial {gpus_per_trial})")
    if groups:  # the study's fingerprint, pre-screen and confirmations: the first group
        os.environ["CUDA_VISIBLE_DEVICES"] = groups[0]
    settings = read_run_settings(space or default_space_path(model, sim_model), tuner)
    try:
        options = RunOptions(
            objective=objective,
            workload=workload,
            engine=engine,
            model=model,
            hardware=hardware,
            sim_model=sim_model,
            space=space,
            storage=storage,
            study=study,
            trials=trials,
            timeout_s=parse_duration(timeout, option="--timeout"),
            trial_timeout_s=parse_duration(trial_timeout, option="--trial-timeout"),
            sampler=sampler,
            slos=slo or [],
            max_error_rate=max_error_rate,
            load=settings.load_spec(
                mode=mode,
                concurrency=concurrency,
                duration_s=parse_duration(duration, option="--duration"),
            ),
            heartbeat_interval_s=heartbeat_interval,
            gpus_per_trial=gpus_per_trial,
            **_with_seed(settings.run_options(), seed),
        )
    except ValidationError as exc:
        raise option_error(exc) from None
    out = console()
    found: list[str] = []

    def say_found(line: str) -> None:
        out.print(line, highlight=False, soft_wrap=True)
        found.append(line)

    if settings.describe():
        say_found(settings.describe() or "")
    spec = prepare_study(options, say=say_found)
    bound = kv_bound_warning(
        spec.space, model=spec.model, engine_version=None, prescreen=spec.prescreen
    )
    if bound:
        say_found(f"[yellow]warning[/yellow]: {bound}")
    resuming = completed_trials(spec) is not None  # storage errors first, before any file
    output = RunOutput(out, run_log_path(spec))
    if len(groups) > 1:
        spec.workers = lambda: _workers(spec, groups, output)
    try:
        run_with_output(spec, output, found, resuming=resuming)
    finally:
        output.close()


def _with_seed(fields: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """The settings' ``RunOptions`` fields, ``--seed`` over the tuner setting ``seed:``."""
    if seed is None:
        return fields
    return fields | {"tuner": fields["tuner"].model_copy(update={"seed": seed})}


def _workers(spec: StudySpec, groups: list[str], output: RunOutput) -> None:
    """One `autotune worker` per GPU group; their lines on stdout (each logs its own)."""
    output.say(f"{len(groups)} workers, GPU groups {' | '.join(groups)}")
    codes = run_workers(
        spec.storage_url,
        spec.name,
        groups,
        say=lambda line: output.out.print(line, highlight=False, soft_wrap=True, markup=False),
    )
    for group, code in codes.items():
        if code != 0:
            output.say(
                f"[yellow]warning[/yellow]: the worker on GPUs {group} exited with {code}; "
                "a trial it left is retried by the others (or the next run)"
            )


def run_with_output(
    spec: StudySpec, output: RunOutput, found: list[str], *, resuming: bool, summary: bool = True
) -> None:
    """Run the study with live progress; Ctrl-C and SIGTERM interrupt it cleanly."""
    for line in found:
        output.log_only(line)
    existing = load_study(spec.storage_url, spec.name) if resuming else None
    if existing is not None:
        output.say(resume_line(existing))
    else:
        output.say(f"Study [bold]{spec.name}[/bold] ({spec.engine.name}, {spec.space.name} space)")
    output.say(f"log: {output.log_path}")
    if spec.token_note:
        output.say(f"[yellow]note:[/yellow] {spec.token_note}")
    tally = Tally(
        n_trials=spec.n_trials,
        already_done=completed_count(existing.study) if existing is not None else 0,
        maximize=spec.goal.directions[0] == "maximize",
        best=best_so_far(existing) if existing is not None else None,
        replay_wall_s=spec.replay_wall_s,
    )
    display, observer = output.progress(tally, METRIC_NAMES[spec.goal.objectives[0]])
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    redeliver_swallowed_interrupts()
    try:
        with display:
            run_study(spec, observer=observer)
    except KeyboardInterrupt:
        kill_all_servers()
        started = _started_trials(spec)
        if not started:
            output.say(
                "[yellow]Interrupted[/yellow] before the first trial: nothing was measured; "
                "run the same command again to start."
            )
            sys.exit(130)
        output.say(
            "[yellow]Interrupted[/yellow]: the running trial is recorded as interrupted; "
            "run the same command again to resume."
        )
        if summary:
            _finish(load_study(spec.storage_url, spec.name), output)
        sys.exit(130)
    loaded = load_study(spec.storage_url, spec.name)
    if summary:
        _finish(loaded, output)
    verdict = stored_verdict(loaded.study)
    if verdict is not None:  # the budget was not spent on trials that would all fail
        output.say(f"[red]{escape(verdict.text())}[/red]")
        output.say("Fix the space or the engine's setup, then run the same command again.")
        sys.exit(1)
    checks = [row.replay.prompt_tokens_check for row in loaded.trials if row.replay]
    mismatched = [check for check in checks if check is not None and not check.ok]
    if mismatched:
        output.say(f"[yellow]warning:[/yellow] {len(mismatched)} trials: {mismatched[0].message}")
    errors = [row.error for row in loaded.trials if row.error]
    if errors and not any(row.state == "COMPLETE" for row in loaded.trials):
        error_console().print(f"[red]error:[/red] every trial failed inside autotune: {errors[0]}")
        sys.exit(1)


def _started_trials(spec: StudySpec) -> int:
    """Trials of the study that were launched (0 when it does not exist yet)."""
    if completed_trials(spec) is None:
        return 0
    study = load_study(spec.storage_url, spec.name)
    return sum(1 for row in study.trials if row.state != "WAITING")


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _finish(loaded: LoadedStudy, output: RunOutput) -> None:
    """The trial table and the summary, on stdout and in the log: on a terminal, where
    the trials' lines scrolled past, `show`'s table of the best few; elsewhere, and in the
    log, every trial in number order."""
    table = trials_table(loaded)
    if output.out.is_terminal:
        print_show(output.out, loaded, limit=FINAL_TABLE_ROWS)
    else:
        output.out.print(table)
    output.log.print(table)
    for line in summary_lines(loaded):
        output.say(line)


@handle_errors
def show(
    storage: StorageOption = DEFAULT_STORAGE_URL,
    study: StudyOption = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Show the first N rows.")] = None,
) -> None:
    """The trials of a study, best first: flags, outcome, score, margins, server stats."""
    print_show(console(), load_study(storage, study), limit=limit)


@handle_errors
def studies(storage: StorageOption = DEFAULT_STORAGE_URL) -> None:
    """The studies in a storage, with trial counts and best values."""
    out = console()
    table = Table(title=f"studies in {storage}")
    for column in ("study", "engine", "hardware", "trials", "complete", "best", "gain"):
        table.add_column(column, justify="right" if column in ("trials", "complete") else "left")
    for name in study_names(storage):
        loaded = load_study(storage, name)
        complete = sum(1 for row in loaded.trials if row.state == "COMPLETE")
        try:
            best = loaded.best()
            metric = METRIC_NAMES[ObjectiveName(loaded.info.primary_objective)]
            best_text = f"{best.values[0]:,.1f} {metric} (#{best.number})" if best.values else "-"
            gain = loaded.gain_over_baseline(best)
        except InputError:
            best_text, gain = "-", None
        table.add_row(
            name,
            loaded.info.engine or "-",
            loaded.info.gpu_name,
            str(len(loaded.trials)),
            str(complete),
            best_text,
            f"{gain:.2f}x" if gain else "-",
        )
    out.print(table)
