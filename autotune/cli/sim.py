"""`autotune sim ...`: the simulator's memory plan, closed-loop predictions, and server."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from autotune.catalog.hardware import gpu_names
from autotune.catalog.models import model_names
from autotune.cli._common import console, handle_errors
from autotune.cli.sim_calibrate import calibrate_command
from autotune.errors import InputError
from autotune.sim.model.calibration_profile import load_profile
from autotune.sim.model.config import SimConfig
from autotune.sim.model.memory import MemoryReport, plan_memory
from autotune.sim.model.units import GIB, parse_human_int
from autotune.sim.virtual.sweep import SweepRow, baseline_config, closed_loop_sweep

app = typer.Typer(no_args_is_help=True, help="The built-in vLLM simulator.")

HardwareOption = Annotated[
    str, typer.Option("--hardware", help="GPU catalog name (see `autotune sim catalog`).")
]
ModelOption = Annotated[str, typer.Option("--model", help="Model catalog name.")]
KvBytesOption = Annotated[
    str | None,
    typer.Option("--kv-cache-memory-bytes", help="KV pool size, vLLM style: 9G (GiB) or 9g (GB)."),
]
UtilOption = Annotated[
    float | None, typer.Option("--gpu-memory-utilization", help="Used without a KV size.")
]
DtypeOption = Annotated[str | None, typer.Option("--kv-cache-dtype", help="auto, fp8_e4m3, ...")]
SeqsOption = Annotated[int | None, typer.Option("--max-num-seqs", min=1)]
BatchOption = Annotated[str | None, typer.Option("--max-num-batched-tokens")]
LenOption = Annotated[str | None, typer.Option("--max-model-len")]
LmOnlyOption = Annotated[
    bool | None, typer.Option("--language-model-only/--no-language-model-only")
]
PrefixOption = Annotated[
    bool | None, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching")
]
LmcacheOption = Annotated[bool, typer.Option("--lmcache", help="LMCache connector on.")]
EagerOption = Annotated[bool, typer.Option("--enforce-eager", help="No CUDA graphs.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
CalibrationOption = Annotated[
    Path | None,
    typer.Option(
        "--calibration",
        help="A calibration profile (autotune sim calibrate) whose speed constants to use.",
    ),
]


def _int_or_none(text: str | None, field: str) -> int | None:
    return None if text is None else parse_human_int(text, field=field)


def _int_list(text: str, field: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise InputError(f"{field}: comma-separated integers expected, got {text!r}") from exc


@app.command("memory")
@handle_errors
def memory_command(
    hardware: HardwareOption = "rtx4080s-32g",
    model: ModelOption = "qwen3.6-27b-awq",
    kv_cache_memory_bytes: KvBytesOption = None,
    gpu_memory_utilization: UtilOption = None,
    kv_cache_dtype: DtypeOption = None,
    mtp: Annotated[int, typer.Option("--mtp", min=0, help="MTP speculative tokens.")] = 0,
    max_num_seqs: SeqsOption = None,
    max_num_batched_tokens: BatchOption = None,
    max_model_len: LenOption = None,
    language_model_only: LmOnlyOption = None,
    enable_prefix_caching: PrefixOption = None,
    lmcache: LmcacheOption = False,
    enforce_eager: EagerOption = False,
    as_json: JsonOption = False,
) -> None:
    """The memory plan vLLM would make: weights, activation, graphs, KV pool, capacity."""
    values: dict[str, object] = {
        "hardware": hardware,
        "model": model,
        "kv_cache_memory_bytes": _int_or_none(kv_cache_memory_bytes, "--kv-cache-memory-bytes"),
        "gpu_memory_utilization": gpu_memory_utilization,
        "kv_cache_dtype": kv_cache_dtype,
        "num_speculative_tokens": mtp,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": _int_or_none(max_num_batched_tokens, "--max-num-batched-tokens"),
        "max_model_len": _int_or_none(max_model_len, "--max-model-len"),
        "language_model_only": language_model_only,
        "enable_prefix_caching": enable_prefix_caching,
        "lmcache": lmcache,
        "enforce_eager": enforce_eager,
    }
    config = SimConfig.model_validate({k: v for k, v in values.items() if v is not None})
    report = plan_memory(config)
    if as_json:
        payload = report.model_dump(mode="json")
        payload["suggested_kv_cache_bytes"] = report.suggested_kv_cache_bytes
        typer.echo(json.dumps(payload))
        return
    _print_memory(report)


def _print_memory(report: MemoryReport) -> None:
    table = Table(title="Simulated vLLM memory plan", show_header=True)
    table.add_column("item")
    table.add_column("GiB", justify="right")
    for label, value in (
        ("visible (total)", report.visible_bytes),
        ("free at startup", report.free_at_startup_bytes),
        ("weights", report.weights_bytes),
        ("  of which vision tower", report.vision_bytes),
        ("peak activation (profile)", report.peak_activation_bytes),
        ("non-torch", report.non_torch_bytes),
        ("CUDA graphs", report.cudagraph_bytes),
        ("LMCache", report.lmcache_bytes),
        ("KV cache", report.kv_cache_bytes),
        ("headroom after startup", report.headroom_bytes),
    ):
        table.add_row(label, f"{value / GIB:.2f}")
    out = console()
    out.print(table)
    block = f"block size {report.block_size}"
    if report.attention_block_size:
        block += " (attention block size set for the hybrid layout)"
    out.print(
        f"KV cache size: {report.kv_cache_tokens:,} tokens, maximum concurrency for "
        f"{report.max_model_len:,} tokens per request: {report.max_concurrency:.2f}x; "
        f"{report.num_gpu_blocks} blocks, {block}; prefix caching "
        f"{'on' if report.enable_prefix_caching else 'off'}"
    )
    if report.fits:
        out.print("[green]fits[/green]")
    else:
        out.print(f"[red]{report.failure_class}[/red]: {report.failure_message}")


@app.command("predict")
@handle_errors
def predict_command(
    hardware: HardwareOption = "rtx4080s-32g",
    model: ModelOption = "qwen3.6-27b-awq",
    concurrency: Annotated[str, typer.Option(help="Comma-separated client counts.")] = (
        "1,4,8,16,32"
    ),
    mtp: Annotated[str, typer.Option(help="Comma-separated MTP token counts.")] = "0,1,2,3",
    prompt_tokens: Annotated[int, typer.Option(min=1)] = 128,
    output_tokens: Annotated[int, typer.Option(min=1)] = 256,
    requests_per_client: Annotated[int, typer.Option(min=1)] = 4,
    kv_cache_memory_bytes: KvBytesOption = None,
    gpu_memory_utilization: UtilOption = None,
    kv_cache_dtype: DtypeOption = None,
    max_num_seqs: SeqsOption = None,
    max_num_batched_tokens: BatchOption = None,
    max_model_len: LenOption = None,
    language_model_only: LmOnlyOption = None,
    enable_prefix_caching: PrefixOption = None,
    seed: Annotated[int, typer.Option(help="Seed of the draft-acceptance draws.")] = 0,
    calibration: CalibrationOption = None,
    as_json: JsonOption = False,
) -> None:
    """Closed-loop throughput and latency for each concurrency x MTP (the hand-run table)."""
    profile = None if calibration is None else load_profile(calibration)
    base = baseline_config(
        hardware,
        model,
        kv_cache_memory_bytes=_int_or_none(kv_cache_memory_bytes, "--kv-cache-memory-bytes"),
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_dtype=kv_cache_dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=_int_or_none(max_num_batched_tokens, "--max-num-batched-tokens"),
        max_model_len=_int_or_none(max_model_len, "--max-model-len"),
        language_model_only=language_model_only,
        enable_prefix_caching=enable_prefix_caching,
    )
    rows = closed_loop_sweep(
        base,
        concurrencies=_int_list(concurrency, "--concurrency"),
        mtps=_int_list(mtp, "--mtp"),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        requests_per_client=requests_per_client,
        seed=seed,
        calibration=profile,
    )
    if as_json:
        payload = {
            "hardware": hardware,
            "model": model,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
            "requests_per_client": requests_per_client,
            "config": base.model_dump(mode="json"),
            "calibration": None if calibration is None else str(calibration),
            "rows": [row.model_dump(mode="json") for row in rows],
        }
        typer.echo(json.dumps(payload))
        return
    _print_sweep(rows, hardware, model, prompt_tokens, output_tokens)


def _print_sweep(
    rows: list[SweepRow], hardware: str, model: str, prompt_tokens: int, output_tokens: int
) -> None:
    table = Table(
        title=f"{model} on {hardware}: closed loop, {prompt_tokens} in / {output_tokens} out"
    )
    for column in ("concurrency", "MTP", "wall s", "mean latency s", "output tok/s", "accept len"):
        table.add_column(column, justify="right")
    reasons: dict[str, None] = {}
    for row in rows:
        if row.failure is not None:
            failure_class, _, reason = row.failure.partition(": ")
            if reason:
                reasons[reason] = None
            table.add_row(str(row.concurrency), str(row.mtp), "-", "-", failure_class, "-")
            continue
        table.add_row(
            str(row.concurrency),
            str(row.mtp),
            f"{row.duration_s:.1f}",
            f"{row.mean_latency_s:.2f}",
            f"{row.output_tokens_per_s:.0f}",
            "-" if row.mean_acceptance_length is None else f"{row.mean_acceptance_length:.2f}",
        )
    out = console()
    out.print(table)
    expected = next((row.expected_error for row in rows if row.expected_error is not None), None)
    if expected is not None:
        out.print(f"calibrated: expected error about {expected:.0%} per figure")
    for reason in reasons:
        out.print(f"[red]{reason}[/red]")


app.command("calibrate")(calibrate_command)


@app.command("catalog")
def catalog_command() -> None:
    """List the GPUs and models the simulator knows."""
    out = console()
    out.print("GPUs: " + ", ".join(gpu_names()))
    out.print("models: " + ", ".join(model_names()))


@app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,  # --help goes to the server's own parser: its real flags
)
def serve_command(ctx: typer.Context) -> None:
    """Run the simulated vLLM server: `autotune sim serve MODEL --hardware GPU` + vLLM flags."""
    from autotune.sim.server import server  # the ASGI stack: this command only

    sys.exit(server.main(list(ctx.args)))
