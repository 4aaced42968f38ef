"""`autotune replay`: replay a workload against a running server and print what it measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autotune.cli._common import (
    LOAD_DEFAULTS,
    MAX_GAP_DEFAULT,
    console,
    handle_errors,
    parse_duration,
)
from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.replay.records import Percentiles, RequestRecord
from autotune.replay.sweep import LevelResult, run_sweep, sweep_loads
from autotune.workload.expand import load_plan
from autotune.workload.hf_tokenizer import load_tokenizer


class _ProgressObserver:
    """A rich progress bar fed by the runner's on_request_done."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task = progress.add_task("requests", total=None)

    def on_request_done(self, record: RequestRecord, done: int, total: int | None) -> None:
        self._progress.update(self._task, completed=done, total=total)


def _levels(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise InputError(f"--sweep: expected comma-separated integers, but got {text!r}") from exc
    if not levels or min(levels) < 1:
        raise InputError(f"--sweep: every level must be >= 1, but got {text!r}")
    return levels


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.0f}"


def _sweep_table(levels: list[LevelResult]) -> Table:
    table = Table(title="replay (modelled seconds)")
    for column in (
        "concurrency", "wall s", "mean latency s", "output tok/s", "req/s",
        "TTFT p50 ms", "TTFT p95 ms", "TPOT mean ms", "errors", "stopped early",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for level in levels:
        stats = level.result.stats
        mean_e2e = stats.e2e.mean
        table.add_row(
            "-" if level.load.mode == "trace" else str(level.load.concurrency),
            f"{stats.duration_s:,.1f}",
            "-" if mean_e2e is None else f"{mean_e2e:,.2f}",
            f"{stats.output_throughput_tok_s:,.1f}",
            f"{stats.request_throughput_rps:,.2f}",
            _ms(stats.ttft.p50),
            _ms(stats.ttft.p95),
            _ms(stats.tpot.mean),
            str(stats.failed),
            stats.stopped_early or "",
        )
    return table


def _latency_table(name: str, values: Percentiles) -> list[str]:
    return [name, *(_ms(getattr(values, key)) for key in ("mean", "p50", "p90", "p95", "p99"))]


def _print_level(level: LevelResult) -> None:
    stats, server = level.result.stats, level.result.server_stats
    out = console()
    out.print(
        f"{stats.completed} completed, {stats.failed} failed in {stats.duration_s:,.1f}s: "
        f"{stats.request_throughput_rps:,.2f} req/s, {stats.output_throughput_tok_s:,.1f} output "
        f"tok/s, {stats.total_token_throughput_tok_s:,.1f} total tok/s, "
        f"peak {stats.max_concurrent_requests} in flight",
        highlight=False,
    )
    for error_class, count in stats.errors_by_class.items():
        example = next(
            (
                r.error_detail
                for r in level.result.records
                if r.error and r.error.value == error_class
            ),
            None,
        )
        out.print(f"[red]{error_class}[/red]: {count}, e.g. {example}", highlight=False)
    if stats.stopped_early:
        out.print(f"[yellow]stopped early:[/yellow] {stats.stopped_early}", highlight=False)
    check = stats.prompt_tokens_check
    if check is not None and not check.ok:
        out.print(f"[yellow]{check.message}[/yellow]", highlight=False)
    table = Table()
    for column in ("ms", "mean", "p50", "p90", "p95", "p99"):
        table.add_column(column, justify="right")
    for name in ("ttft", "tpot", "itl", "e2e"):
        table.add_row(*_latency_table(name.upper(), getattr(stats, name)))
    out.print(table)
    if server is not None:
        generated = server.generation_tokens
        parts = [f"generation tokens {generated}"]
        if generated is not None and generated != stats.total_output_tokens:
            # in-window output only; warm-up, failed requests or other clients also count there
            parts[0] += f" (client counted {stats.total_output_tokens} in its window)"
        if server.prefix_cache_hit_rate is not None:
            parts.append(f"prefix cache hit rate {server.prefix_cache_hit_rate:.1%}")
        if stats.first_prefill_hit_rate is not None:
            parts.append(f"cached at first prefill {stats.first_prefill_hit_rate:.1%}")
        if server.external_prefix_cache_hit_rate is not None:
            parts.append(f"external hit rate {server.external_prefix_cache_hit_rate:.1%}")
        if server.preemptions:
            parts.append(f"preemptions {server.preemptions}")
        if server.peak_kv_cache_usage is not None and server.scrapes > 2:  # peaks need mid-run
            parts.append(f"peak KV usage {server.peak_kv_cache_usage:.0%}")
        if server.spec_decode_acceptance_rate is not None:
            parts.append(f"spec-decode acceptance {server.spec_decode_acceptance_rate:.1%}")
        out.print("server: " + ", ".join(parts), highlight=False)
    if level.prefix_cache_note:
        out.print(f"[yellow]note:[/yellow] {level.prefix_cache_note}", highlight=False)


@handle_errors
def replay_command(
    url: Annotated[str, typer.Option(help="Server base URL, e.g. http://127.0.0.1:8000")],
    workload: Annotated[Path, typer.Option("--workload", "-w", help="Workload JSONL file.")],
    mode: Annotated[str, typer.Option(help="concurrency, sessions or trace.")] = LOAD_DEFAULTS.mode,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Requests / sessions at once.")
    ] = LOAD_DEFAULTS.concurrency,
    sweep: Annotated[
        str | None, typer.Option(help="Run once per concurrency level, e.g. 1,4,8,16,32.")
    ] = None,
    time_scale: Annotated[
        float, typer.Option(min=0.0, help="Replay recorded gaps and arrivals this many x faster.")
    ] = LOAD_DEFAULTS.timing_scale,
    max_gap: Annotated[
        str | None, typer.Option(help="Cap on a recorded gap, e.g. 30s.")
    ] = MAX_GAP_DEFAULT,
    duration: Annotated[str | None, typer.Option(help="Stop sending after, e.g. 5m.")] = None,
    max_requests: Annotated[
        int | None, typer.Option(min=1, help="Stop sending after this many.")
    ] = None,
    warmup: Annotated[
        int, typer.Option(min=0, help="First N completions left out of the stats.")
    ] = LOAD_DEFAULTS.warmup_requests,
    recycle: Annotated[
        bool, typer.Option(help="Sessions: replay again with fresh salts to fill --duration.")
    ] = LOAD_DEFAULTS.recycle_sessions,
    server_time_scale: Annotated[
        float, typer.Option(min=0.0, help="The simulator's own --time-scale (1 for vLLM).")
    ] = 1.0,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar=["OPENAI_API_KEY", "VLLM_API_KEY"],
            show_envvar=True,
            help="API key (never stored or printed).",
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="Model name (default: the first at /v1/models).")] = "",
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Render prompts token-exact in this tokenizer (the served model's dir, "
            "tokenizer.json or cached name)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as JSON.")] = False,
) -> None:
    """Replay a workload against a running OpenAI/Anthropic-compatible server."""
    base = LoadSpec(
        mode=mode,  # type: ignore[arg-type]  # pydantic validates the literal
        concurrency=concurrency,
        timing_scale=time_scale,
        max_gap_s=parse_duration(max_gap, option="--max-gap"),
        duration_s=parse_duration(duration, option="--duration"),
        max_requests=max_requests,
        warmup_requests=warmup,
        recycle_sessions=recycle,
    )
    if server_time_scale <= 0:
        raise InputError(f"--server-time-scale must be > 0, but got {server_time_scale}")
    loads = sweep_loads(base, _levels(sweep))
    model_tokenizer = None
    if tokenizer is not None:
        model_tokenizer = load_tokenizer(tokenizer)
        if model_tokenizer is None:
            raise InputError(f"--tokenizer: no tokenizer.json found offline for {tokenizer!r}")
    plan = load_plan(workload, tokenizer=model_tokenizer)

    def run(observer: _ProgressObserver | None = None) -> list[LevelResult]:
        return run_sweep(
            url=url, plan=plan, loads=loads, model_name=model,
            server_time_scale=server_time_scale, api_key=api_key, observer=observer,
        )  # fmt: skip

    if as_json:
        levels = run()
        payload = [
            level.model_dump(mode="json", exclude={"result": {"records"}}) for level in levels
        ]
        print(json.dumps(payload, indent=2))
        return
    with Progress(
        TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console(), transient=True,
    ) as progress:  # fmt: skip
        levels = run(_ProgressObserver(progress))
    if len(levels) > 1:
        console().print(_sweep_table(levels))
        for level in levels:
            if level.prefix_cache_note:
                console().print(f"[yellow]note:[/yellow] {level.prefix_cache_note}")
        return
    _print_level(levels[0])


def register(app: typer.Typer) -> None:
    """Add `autotune replay` to the root app."""
    app.command("replay")(replay_command)
