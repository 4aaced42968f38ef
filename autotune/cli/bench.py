"""`autotune bench serve`: a `vllm bench serve` command line, run by autotune's replayer.

The flags are vLLM's own (docs/bench.md maps each); the server is one already running
(``--base-url``, or ``--host`` and ``--port``) or the simulator, started on a free port of
127.0.0.1 (``--engine sim --hardware GPU --model MODEL``, its `vllm serve` flags after
``--``) and replayed in lockstep with its clock. The summary is vLLM's block.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Annotated, cast

import typer

from autotune.cli._common import console, handle_errors
from autotune.errors import InputError, ServerStartFailed
from autotune.replay.bench_datasets import BenchDataset, DatasetName, bench_plan
from autotune.replay.bench_serve import bench_load, serving_result
from autotune.replay.load import LoadSpec
from autotune.replay.runner import UNANSWERED_LIMIT_S, ReplayResult, replay
from autotune.workload.hf_tokenizer import load_tokenizer
from autotune.workload.plan import WorkloadPlan

app = typer.Typer(
    no_args_is_help=True,
    help="Run a `vllm bench serve` command line on a server or the simulator.",
)

SIM_STARTUP_TIMEOUT_S = 120.0  # wall: the simulator is up in seconds


def _rate(text: str) -> float:
    """``--request-rate``: requests/s, or ``inf`` (vLLM's default: all at once)."""
    try:
        rate = float(text)
    except ValueError:
        raise InputError(f"--request-rate {text!r}: expected a number or inf") from None
    if not rate > 0:
        raise InputError(f"--request-rate {text!r}: must be > 0 (or inf)")
    return rate


async def _on_simulator(
    plan: WorkloadPlan, load: LoadSpec, *, hardware: str, model: str, sim_args: list[str]
) -> ReplayResult:
    from autotune.catalog.models import get_model  # the engines: only for --engine sim
    from autotune.config.trial_config import TrialConfig
    from autotune.engines.sim import SimEngine

    get_model(model)  # an unknown catalog name is one line naming the known ones
    engine = SimEngine(hardware=hardware, extra_args=sim_args)
    with tempfile.TemporaryDirectory(prefix="autotune-bench-") as folder:
        log_path = Path(folder) / "server.log"
        try:
            async with engine.launch(
                TrialConfig(model=model, flags={}),
                log_path=log_path,
                startup_timeout_s=SIM_STARTUP_TIMEOUT_S,
            ) as server:
                return await replay(
                    url=server.url,
                    plan=plan,
                    load=load,
                    model_name=server.served_model_name,
                    server_time_scale=server.time_scale,
                    lockstep=server.lockstep,
                )
        except ServerStartFailed as exc:
            raise InputError(f"the simulator did not start: {exc}") from None


@app.command("serve", context_settings={"allow_extra_args": True})
@handle_errors
def serve_command(
    ctx: typer.Context,
    engine: Annotated[
        str | None,
        typer.Option(help="sim: start the simulator (--hardware, --model); default: a server."),
    ] = None,
    hardware: Annotated[str | None, typer.Option(help="GPU catalog name (--engine sim).")] = None,
    base_url: Annotated[
        str | None, typer.Option(help="A running server, e.g. http://127.0.0.1:8000.")
    ] = None,
    host: Annotated[str, typer.Option(help="Without --base-url.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Without --base-url.")] = 8000,
    model: Annotated[
        str,
        typer.Option(help="Served model name (default: the server's first); catalog name (sim)."),
    ] = "",
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Count prompts in this tokenizer (a model dir or tokenizer.json)."),
    ] = None,
    dataset_name: Annotated[str, typer.Option(help="random or sharegpt.")] = "random",
    dataset_path: Annotated[Path | None, typer.Option(help="ShareGPT JSON.")] = None,
    num_prompts: Annotated[int, typer.Option()] = 1000,
    random_input_len: Annotated[int, typer.Option()] = 1024,
    random_output_len: Annotated[int, typer.Option()] = 128,
    random_range_ratio: Annotated[float, typer.Option()] = 0.0,
    random_prefix_len: Annotated[int, typer.Option()] = 0,
    sharegpt_output_len: Annotated[int | None, typer.Option()] = None,
    request_rate: Annotated[str, typer.Option(help="Requests/s, Poisson; inf: all at once.")] = (
        "inf"
    ),
    burstiness: Annotated[float, typer.Option(help="Gamma shape of the arrivals.")] = 1.0,
    max_concurrency: Annotated[int | None, typer.Option(min=1)] = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos")] = False,
    seed: Annotated[int, typer.Option()] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the stats as JSON.")] = False,
) -> None:
    """Run a `vllm bench serve` command line against a server or the simulator.

    Simulator flags (`vllm serve` flags) go after `--`, e.g.
    `autotune bench serve --engine sim --hardware h100-80g --model llama-3.1-8b
    --max-concurrency 16 --ignore-eos -- --max-num-seqs 256`.
    """
    rate = _rate(request_rate)
    if engine not in (None, "sim"):
        raise InputError(f"--engine {engine!r}: only sim (without it: the server at --base-url)")
    if dataset_name not in ("random", "sharegpt"):
        raise InputError(f"--dataset-name {dataset_name!r}: random or sharegpt")
    dataset = BenchDataset(
        name=cast(DatasetName, dataset_name),
        num_prompts=num_prompts,
        seed=seed,
        random_input_len=random_input_len,
        random_output_len=random_output_len,
        random_range_ratio=random_range_ratio,
        random_prefix_len=random_prefix_len,
        dataset_path=dataset_path,
        sharegpt_output_len=sharegpt_output_len,
        ignore_eos=ignore_eos,
    )
    model_tokenizer = None
    if tokenizer is not None:
        model_tokenizer = load_tokenizer(tokenizer)
        if model_tokenizer is None:
            raise InputError(f"--tokenizer: no tokenizer.json found offline for {tokenizer!r}")
    plan = bench_plan(dataset, request_rate=rate, burstiness=burstiness, tokenizer=model_tokenizer)
    load = bench_load(num_prompts=num_prompts, max_concurrency=max_concurrency, request_rate=rate)
    if engine == "sim":
        if hardware is None or not model:
            raise InputError("--engine sim needs --hardware and --model (catalog names)")
        result = asyncio.run(
            _on_simulator(plan, load, hardware=hardware, model=model, sim_args=list(ctx.args))
        )
    else:
        if ctx.args:
            raise InputError(f"flags after -- are the simulator's (--engine sim): {ctx.args}")
        url = base_url or f"http://{host}:{port}"
        result = asyncio.run(
            replay(
                url=url, plan=plan, load=load, model_name=model,
                unanswered_limit_s=UNANSWERED_LIMIT_S,
            )
        )  # fmt: skip
    if as_json:
        print(json.dumps(result.stats.model_dump(mode="json"), indent=2))
        return
    for line in serving_result(result.stats, max_concurrency=max_concurrency, request_rate=rate):
        console().print(line, highlight=False, markup=False)
