"""`autotune try`: run one configuration end to end, the way every study trial runs."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from rich.table import Table

from autotune.cli._common import (
    LOAD_DEFAULTS,
    console,
    error_console,
    handle_errors,
    parse_duration,
)
from autotune.config.space import SearchSpace, default_space_path
from autotune.defaults import DEFAULT_RUNS_DIR
from autotune.errors import InputError
from autotune.study import run_configured_trial, score_result
from autotune.study.setup import RunOptions, prepare_study
from autotune.trial.objective import Score
from autotune.trial.run import TrialResult, derive_config
from autotune.tuner.settings_file import read_run_settings


def register(app: typer.Typer) -> None:
    """Add `try` to the root app."""
    app.command("try")(try_config)


@handle_errors
def try_config(
    workload: Annotated[Path, typer.Option("--workload", "-w", help="Workload JSONL file.")],
    model: Annotated[str, typer.Option("--model", help="Catalog name (sim) or path/id.")],
    engine: Annotated[str, typer.Option("--engine", help="sim or vllm.")] = "sim",
    hardware: Annotated[str | None, typer.Option("--hardware", help="GPU catalog name.")] = None,
    space: Annotated[Path | None, typer.Option("--space", help="Search-space YAML.")] = None,
    tuner: Annotated[
        Path | None,
        typer.Option(
            "--tuner",
            help="YAML of the load, simulator and engine details, as `autotune run` reads "
            "them (docs/tuner.md); its keys win over the space's tuner: section.",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="NAME=VALUE over the space's baseline (repeatable)."),
    ] = None,
    slo: Annotated[list[str] | None, typer.Option("--slo", help="e.g. ttft_p95<=2s.")] = None,
    mode: Annotated[
        str, typer.Option("--mode", help="sessions, concurrency or trace.")
    ] = LOAD_DEFAULTS.mode,
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Sessions (or requests) in flight.")
    ] = LOAD_DEFAULTS.concurrency,
    duration: Annotated[str | None, typer.Option("--duration", help="Replay budget.")] = None,
    sim_model: Annotated[
        str | None,
        typer.Option("--sim-model", help="Catalog model to simulate or pre-screen."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Launch the space's baseline (with --set changes), replay, score, stop: no study.

    The load, simulator and engine details come from the space's tuner: section or
    --tuner FILE, as in `autotune run`; the config is launched whatever the memory
    pre-screen predicts.
    """
    settings = read_run_settings(space or default_space_path(model, sim_model), tuner)
    options = RunOptions(
        workload=workload,
        model=model,
        engine=engine,
        hardware=hardware,
        space=space,
        storage="sqlite://",
        slos=slo or [],
        load=settings.load_spec(
            mode=mode,
            concurrency=concurrency,
            duration_s=parse_duration(duration, option="--duration"),
        ),
        sim_model=sim_model,
        **settings.run_options() | {"tuner": settings.tuner.replaced(prescreen=False)},
    )
    spec = prepare_study(options, say=None if as_json else _say)
    if spec.token_note:
        error_console().print(f"[yellow]note:[/yellow] {spec.token_note}", highlight=False)
    params = spec.space.baseline_params() | parse_assignments(set_ or [], spec.space)
    config = derive_config(
        spec.space,
        params,
        model=model,
        engine_version=spec.engine.version(),
        prescreen=spec.prescreen,
    )
    log_path = DEFAULT_RUNS_DIR / f"try-{time.strftime('%Y%m%d-%H%M%S')}" / "server.log"
    result = run_configured_trial(spec, config, log_path=log_path)
    scored = score_result(spec.goal, result)
    if as_json:
        print(json.dumps(_summary(result, scored, params)))
        return
    _print(result, scored, params)


def _say(line: str) -> None:
    console().print(line, highlight=False, soft_wrap=True)


def parse_assignments(texts: list[str], space: SearchSpace) -> dict[str, Any]:
    """``NAME=VALUE`` pairs, each typed and checked against the space's parameter."""
    values: dict[str, Any] = {}
    distributions = space.distributions()
    for text in texts:
        name, sep, raw = text.partition("=")
        if not sep or name not in distributions:
            known = ", ".join(distributions)
            raise InputError(f"--set {text!r}: expected NAME=VALUE with NAME one of {known}")
        distribution = distributions[name]
        value = _typed(raw, distribution, text)
        low, high = getattr(distribution, "low", value), getattr(distribution, "high", value)
        if not low <= value <= high:
            raise InputError(f"--set {text!r}: outside the space's range {low}..{high}")
        values[name] = value
    return values


def _typed(raw: str, distribution: Any, text: str) -> Any:
    dists = optuna.distributions
    try:
        if isinstance(distribution, dists.IntDistribution):
            return int(raw)
        if isinstance(distribution, dists.FloatDistribution):
            return float(raw)
    except ValueError:
        raise InputError(f"--set {text!r}: not a number") from None
    for choice in distribution.choices:
        if str(choice).lower() == raw.lower():
            return choice
    choices = ", ".join(str(choice) for choice in distribution.choices)
    raise InputError(f"--set {text!r}: expected one of {choices}")


def _summary(result: TrialResult, scored: Score, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "outcome": scored.outcome,
        "values": scored.values,
        "constraints": scored.constraints,
        "params": params,
        "argv": result.argv,
        "startup": result.startup.model_dump(mode="json") if result.startup else None,
        "replay": result.stats.model_dump(mode="json") if result.stats else None,
        "server_stats": result.server_stats.model_dump(mode="json")
        if result.server_stats
        else None,
        "failure": result.failure.model_dump(mode="json") if result.failure else None,
        "log": str(result.log_path) if result.log_path else None,
    }


def _print(result: TrialResult, scored: Score, params: dict[str, Any]) -> None:
    out = console()
    style = "green" if scored.feasible else "red"
    out.print(
        f"[{style}]{scored.outcome}[/{style}]  "
        + " ".join(f"{name}={value}" for name, value in params.items()),
        highlight=False,
        soft_wrap=True,
    )
    if result.argv:
        out.print(shlex.join(result.argv), highlight=False, soft_wrap=True)
    if result.failure is not None:
        out.print(f"[red]{result.failure.message}[/red]", highlight=False, soft_wrap=True)
    table = Table(show_header=False, box=None)
    stats, startup = result.stats, result.startup
    if stats is not None:
        table.add_row("output tok/s", f"{stats.output_throughput_tok_s:,.1f}")
        table.add_row("requests", f"{stats.completed} ok, {stats.failed} failed")
        for name in ("ttft", "tpot", "e2e"):
            pct = getattr(stats, name)
            if pct.p50 is not None:
                table.add_row(f"{name} p50 / p95", f"{pct.p50:.3f} / {pct.p95:.3f} s")
    if startup is not None and startup.kv_cache_tokens is not None:
        table.add_row("KV cache", f"{startup.kv_cache_tokens:,} tokens")
    hit = result.server_stats.prefix_cache_hit_rate if result.server_stats else None
    if hit is not None:
        table.add_row("prefix cache hit rate", f"{100 * hit:.1f}%")
    for key, value in scored.constraints.items():
        table.add_row(f"margin {key}", f"{value:+.3f}")
    out.print(table)
    check = stats.prompt_tokens_check if stats is not None else None
    if check is not None:
        style = "green" if check.ok else "yellow"
        out.print(f"[{style}]{check.message}[/{style}]", highlight=False, soft_wrap=True)
    if result.log_path is not None:
        out.print(f"server log: {result.log_path}", highlight=False)
