"""`autotune workload ...`: import, stats, slice, gen."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from autotune.cli._common import console, handle_errors, parse_duration
from autotune.errors import InputError
from autotune.workload.expand import load_plan
from autotune.workload.gen import ChatParams, ClaudeCodeParams, chat, claudecode, fixed
from autotune.workload.hf_tokenizer import load_tokenizer
from autotune.workload.importers import import_workload
from autotune.workload.importers.detect import detect_source
from autotune.workload.io import Workload, read_workload, write_workload
from autotune.workload.plan import Endpoint
from autotune.workload.slice import slice_workload
from autotune.workload.stats import DEFAULT_STATS_BLOCK_SIZE, WorkloadStats, workload_stats

app = typer.Typer(no_args_is_help=True, help="Workload files: import, inspect, cut, generate.")
gen_app = typer.Typer(no_args_is_help=True, help="Generate a synthetic workload file.")
app.add_typer(gen_app, name="gen")

OutArg = Annotated[Path, typer.Argument(help="Workload file to write (JSONL).")]
SeedOption = Annotated[int, typer.Option("--seed", help="Random seed.")]
EndpointOption = Annotated[
    str, typer.Option("--endpoint", help="openai.chat | openai.completions | anthropic.messages")
]


def _endpoint(value: str) -> Endpoint:
    if value not in ("openai.chat", "openai.completions", "anthropic.messages"):
        raise typer.BadParameter(f"unknown endpoint {value!r}")
    return value  # type: ignore[return-value]  # narrowed by the check above


def _write(workload: Workload, out: Path) -> None:
    size_bytes = write_workload(out, workload.records())
    sessions = {request.session for request in workload.requests if request.session}
    console().print(
        f"wrote {out}: {len(workload.requests)} requests, {len(sessions)} sessions, "
        f"{size_bytes / 1024:.1f} KiB",
        highlight=False,
        soft_wrap=True,
    )


@gen_app.command("claudecode")
@handle_errors
def gen_claudecode(
    out: OutArg,
    sessions: Annotated[int, typer.Option(min=1, help="Number of agent sessions.")] = 16,
    seed: SeedOption = 0,
    turns: Annotated[int, typer.Option("--turns", min=1, help="User requests per session.")] = 3,
    requests_per_session: Annotated[
        int | None, typer.Option(min=1, help="Cap on requests per session (all threads).")
    ] = None,
    max_context: Annotated[
        int | None, typer.Option(min=1, help="End a session before its prompt exceeds this.")
    ] = 128_000,
    prefix_tokens: Annotated[
        int, typer.Option(min=1, help="Shared system + tools prefix tokens.")
    ] = 18_000,
    subagent_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Chance a user request spawns subagents.")
    ] = 0.25,
    endpoint: EndpointOption = "openai.chat",
) -> None:
    """Claude Code-like agent sessions (shared prefix, tool loops, subagents)."""
    params = ClaudeCodeParams(
        sessions=sessions,
        seed=seed,
        user_turns=turns,
        requests_per_session=requests_per_session,
        max_context=max_context,
        prefix_tokens=prefix_tokens,
        subagent_prefix_tokens=min(8_500, prefix_tokens),
        subagent_rate=subagent_rate,
        endpoint=_endpoint(endpoint),
    )
    _write(claudecode(params), out)


@gen_app.command("chat")
@handle_errors
def gen_chat(
    out: OutArg,
    requests: Annotated[int, typer.Option(min=1, help="Number of requests.")] = 200,
    seed: SeedOption = 0,
    rate_rps: Annotated[float, typer.Option(min=0.001, help="Poisson arrival rate.")] = 2.0,
    prompt_tokens: Annotated[int, typer.Option(min=1, help="Median prompt tokens.")] = 800,
    output_tokens: Annotated[int, typer.Option(min=1, help="Median output tokens.")] = 250,
    system_tokens: Annotated[int, typer.Option(min=0, help="Shared system prompt.")] = 0,
    endpoint: EndpointOption = "openai.chat",
) -> None:
    """Independent chat requests with lognormal lengths and Poisson arrivals."""
    params = ChatParams(
        requests=requests,
        seed=seed,
        rate_rps=rate_rps,
        prompt_tokens_median=prompt_tokens,
        output_tokens_median=output_tokens,
        system_tokens=system_tokens,
        endpoint=_endpoint(endpoint),
    )
    _write(chat(params), out)


@gen_app.command("fixed")
@handle_errors
def gen_fixed(
    out: OutArg,
    requests: Annotated[int, typer.Option(min=1, help="Number of requests.")] = 64,
    prompt_tokens: Annotated[int, typer.Option(min=1, help="Prompt tokens each.")] = 512,
    output_tokens: Annotated[int, typer.Option(min=1, help="Output tokens each.")] = 256,
    endpoint: EndpointOption = "openai.chat",
) -> None:
    """Identical-size independent requests (a hand-run concurrency benchmark)."""
    workload = fixed(
        requests=requests,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        endpoint=_endpoint(endpoint),
    )
    _write(workload, out)


ImportFrom = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="weka | mooncake | sharegpt | openai-log | anthropic-log (default: from the file)",
        show_default=False,
    ),
]


@app.command("import")
@handle_errors
def import_(
    source: Annotated[Path, typer.Argument(help="Trace file (or a directory of Weka traces).")],
    out: OutArg,
    from_: ImportFrom = None,
    endpoint: EndpointOption = "openai.chat",
) -> None:
    """Convert a foreign trace or request log to a workload file; report what was dropped."""
    if from_ is None:
        if not source.exists():
            raise InputError(f"{source}: no such file or directory")
        from_ = detect_source(source)
        console().print(
            f"read {source} as {from_} (--from to override)", highlight=False, soft_wrap=True
        )
    workload, report = import_workload(from_, source, endpoint=_endpoint(endpoint))
    for line in report.lines():
        console().print(line, highlight=False, soft_wrap=True)
    _write(workload, out)


@app.command("stats")
@handle_errors
def stats(
    path: Annotated[Path, typer.Argument(help="Workload file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    block_size: Annotated[
        int, typer.Option(min=1, help="Block size of the ideal prefix cache (tokens).")
    ] = DEFAULT_STATS_BLOCK_SIZE,
    skip_invalid: Annotated[bool, typer.Option(help="Drop and count invalid lines.")] = False,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Count in this tokenizer (model dir, tokenizer.json or cached name)."),
    ] = None,
) -> None:
    """Requests, sessions, token distributions, ideal prefix-hit ratio, concurrency."""
    model_tokenizer = None
    if tokenizer is not None:
        model_tokenizer = load_tokenizer(tokenizer)
        if model_tokenizer is None:
            raise InputError(f"--tokenizer: no tokenizer.json found offline for {tokenizer!r}")
    plan = load_plan(path, skip_invalid=skip_invalid, tokenizer=model_tokenizer)
    result = workload_stats(plan, block_size=block_size, tokenizer=model_tokenizer)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    console().print(_stats_table(result))
    if (note := _billing_header_note(result)) is not None:
        console().print(note, highlight=False, soft_wrap=True)


@app.command("slice")
@handle_errors
def slice_(
    path: Annotated[Path, typer.Argument(help="Workload file to cut.")],
    out: Annotated[Path | None, typer.Argument(help="Output (default: PATH.slice.jsonl).")] = None,
    sessions: Annotated[int | None, typer.Option(min=1, help="Keep the first N sessions.")] = None,
    max_context: Annotated[
        int | None, typer.Option(min=1, help="Drop requests whose prompt + output exceed this.")
    ] = None,
    duration: Annotated[
        str | None, typer.Option(help="Keep requests arriving in the first D, e.g. 10m or 90s.")
    ] = None,
    skip_invalid: Annotated[bool, typer.Option(help="Drop and count invalid lines.")] = False,
) -> None:
    """Cut a workload to what a card can hold, and say what was cut."""
    workload = read_workload(path, skip_invalid=skip_invalid)
    for line in workload.skipped:
        console().print(f"skipped invalid line {line}", highlight=False, soft_wrap=True)
    sliced, report = slice_workload(
        workload,
        sessions=sessions,
        max_context=max_context,
        duration_s=parse_duration(duration, option="--duration"),
    )
    for line in report.lines():
        console().print(line, highlight=False, soft_wrap=True)
    if not sliced.requests:  # an empty workload replays nothing: say so, write nothing
        raise InputError(f"{path}: {report.nothing_kept()}")
    _write(sliced, out or path.with_suffix(".slice.jsonl"))


def _stats_table(result: WorkloadStats) -> Table:
    table = Table(title=f"{result.name} (tokens in {result.token_space})", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("requests", str(result.requests))
    table.add_row("sessions / threads", f"{result.sessions} / {result.threads}")
    table.add_row("independent requests", str(result.independent_requests))
    distributions = (("input", result.input_tokens), ("output", result.output_tokens))
    for label, dist in distributions:
        table.add_row(
            f"{label} tokens p50 / p90 / p99 / max",
            f"{dist.p50:,.0f} / {dist.p90:,.0f} / {dist.p99:,.0f} / {dist.max:,}",
        )
    table.add_row(
        f"ideal prefix-hit ratio ({result.block_size}-token blocks)",
        f"{result.prefix_hit_ratio:.1%}",
    )
    table.add_row("peak concurrent sessions", str(result.peak_concurrent_sessions))
    table.add_row("duration (recorded arrivals)", f"{result.duration_s:,.1f} s")
    if result.skipped_lines:
        table.add_row("invalid lines skipped", str(result.skipped_lines))
    if result.billing_header_requests:
        table.add_row(
            "recorded with Claude Code's billing header",
            f"{result.billing_header_requests:,} of {result.requests:,} requests",
        )
    return table


def _billing_header_note(result: WorkloadStats) -> str | None:
    if not result.billing_header_requests:
        return None
    return (
        f"{result.billing_header_requests} recorded requests carried Claude Code's per-request "
        "x-anthropic-billing-header block: live, the server missed the prefix cache on each of "
        "them. This file drops the block, so the ideal prefix-hit ratio above is what the "
        "traffic reaches with CLAUDE_CODE_ATTRIBUTION_HEADER=0 set."
    )
