"""vLLM-format log lines, worded exactly as vLLM words them.

Another module (``autotune.engines.vllm_log``) parses real vLLM logs and the
simulator's with the same code, so every message here copies vLLM's format
string (0.33.0 unless noted; each function names the vLLM source file that logs
it, e.g. ``vllm/entrypoints/common/startup.py``). The line format is
vLLM's ``(Process pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from autotune.sim.model.units import GIB, MIB

API_SERVER = "APIServer"
ENGINE_CORE = "EngineCore"
# vLLM's suggestion in the memory summary leaves this much unused (gpu_worker.py).
SUGGESTION_MARGIN_BYTES = 150 * MIB


class VllmLog:
    """Writes vLLM-format lines to a stream (stdout by default), flushed per line."""

    def __init__(
        self,
        *,
        api_pid: int,
        engine_pid: int,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api_pid = api_pid
        self.engine_pid = engine_pid
        self._stream = stream if stream is not None else sys.stdout
        self._clock = clock

    def _write(self, process: str, pid: int, level: str, source: str, message: str) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(self._clock()))
        prefix = f"({process} pid={pid}) {level} {stamp} [{source}] "
        # vLLM prefixes every line of a multi-line message (tracebacks included).
        text = "".join(f"{prefix}{line}\n" for line in message.split("\n"))
        self._stream.write(text)
        self._stream.flush()

    def api(self, source: str, message: str, *, level: str = "INFO") -> None:
        self._write(API_SERVER, self.api_pid, level, source, message)

    def engine(self, source: str, message: str, *, level: str = "INFO") -> None:
        self._write(ENGINE_CORE, self.engine_pid, level, source, message)

    def raw(self, text: str) -> None:
        """Lines printed without vLLM's prefix (uvicorn, bare tracebacks)."""
        self._stream.write(text if text.endswith("\n") else text + "\n")
        self._stream.flush()


def gib(n_bytes: float) -> float:
    return round(n_bytes / GIB, 2)


def thousands(n: int) -> str:
    return f"{n:,}"


def banner_lines(version: str, model: str) -> list[str]:
    """The ASCII logo vLLM prints at startup (``api_utils.py`` / ``startup.py``)."""
    return [
        "",
        "       █     █     █▄   ▄█",
        f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
        f"  █▄█▀ █     █     █     █  model   {model}",
        "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
        "",
    ]


def engine_config_message(version: str, fields: dict[str, object]) -> str:
    """``Initializing a V1 LLM engine (v0.33.0) with config: model='...', ...``.

    Values are written as given (vLLM quotes some strings and not others).
    """
    config = ", ".join(f"{key}={value}" for key, value in fields.items())
    return f"Initializing a V1 LLM engine (v{version}) with config: {config}"


def kv_capacity_lines(
    kv_cache_tokens: int, max_model_len: int, max_concurrency: float, *, merged: bool
) -> list[str]:
    """The KV capacity report: one line since 0.3x, two lines before."""
    size = f"GPU KV cache size: {thousands(kv_cache_tokens)} tokens"
    concurrency = (
        f"Maximum concurrency for {thousands(max_model_len)} tokens per request: "
        f"{max_concurrency:.2f}x"
    )
    return [f"{size}, {concurrency}"] if merged else [size, concurrency]


def kv_reserved_message(free_bytes: int, kv_cache_bytes: int) -> str:
    """Logged instead of the memory summary when --kv-cache-memory-bytes is set."""
    return (
        f"Initial free memory {gib(free_bytes):.2f} GiB, reserved {gib(kv_cache_bytes):.2f} GiB "
        "memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory "
        "profiling. This does not respect the gpu_memory_utilization config. Only use "
        "kv_cache_memory_bytes config when you want manual control of KV cache memory size. "
        "If OOM'ed, check the difference of initial free memory between the current run and "
        "the previous run where kv_cache_memory_bytes is suggested and update it "
        "correspondingly."
    )


def memory_summary_message(
    *,
    free_bytes: int,
    total_bytes: int,
    gpu_memory_utilization: float,
    requested_bytes: int,
    weights_bytes: int,
    non_torch_bytes: int,
    peak_activation_bytes: int,
    cudagraph_bytes: int,
    kv_cache_bytes: int,
    legacy: bool,
) -> str:
    """The profiling summary with vLLM's --kv-cache-memory suggestions.

    ``legacy`` gives the 0.2x wording quoted in the field notes ("... GiB for
    weight, ... GiB for non-torch memory ..."); otherwise 0.33's.
    """
    non_kv = weights_bytes + non_torch_bytes + peak_activation_bytes + cudagraph_bytes
    fit = requested_bytes - non_kv - SUGGESTION_MARGIN_BYTES
    full = free_bytes - non_kv - SUGGESTION_MARGIN_BYTES
    head = (
        f"Free memory on device ({gib(free_bytes)}/{gib(total_bytes)} GiB) on startup. "
        f"Desired GPU memory utilization is ({gpu_memory_utilization}, "
        f"{gib(requested_bytes)} GiB). "
    )
    if legacy:
        usage = (
            f"Actual usage is {gib(weights_bytes)} GiB for weight, "
            f"{gib(peak_activation_bytes)} GiB for peak activation, "
            f"{gib(non_torch_bytes)} GiB for non-torch memory, and "
            f"{gib(cudagraph_bytes)} GiB for CUDAGraph memory. "
        )
    else:
        usage = (
            f"Actual usage is {gib(weights_bytes + non_torch_bytes)} GiB for consumed memory "
            f"(weights + non-torch), {gib(peak_activation_bytes)} GiB for peak activation, "
            f"and {gib(cudagraph_bytes)} GiB for CUDAGraph memory. "
        )
    return (
        head + usage + f"Replace gpu_memory_utilization config with `--kv-cache-memory={fit}` "
        f"({gib(fit)} GiB) to fit into requested memory, or `--kv-cache-memory={full}` "
        f"({gib(full)} GiB) to fully utilize gpu memory. "
        f"Current kv cache memory in use is {gib(kv_cache_bytes)} GiB."
    )


def stats_message(
    *,
    prompt_tokens_per_s: float,
    generation_tokens_per_s: float,
    running: int,
    waiting: int,
    kv_cache_usage: float,
    prefix_hit_rate: float | None,
    external_hit_rate: float | None,
) -> str:
    """The periodic ``Engine 000: Avg prompt throughput: ...`` line (loggers.py)."""
    parts = [
        f"Engine 000: Avg prompt throughput: {prompt_tokens_per_s:.1f} tokens/s",
        f"Avg generation throughput: {generation_tokens_per_s:.1f} tokens/s",
        f"Running: {running} reqs",
        f"Waiting: {waiting} reqs",
    ]
    parts.append(f"GPU KV cache usage: {kv_cache_usage * 100:.1f}%")
    if prefix_hit_rate is not None:
        parts.append(f"Prefix cache hit rate: {prefix_hit_rate * 100:.1f}%")
    if external_hit_rate is not None:
        parts.append(f"External prefix cache hit rate: {external_hit_rate * 100:.1f}%")
    return ", ".join(parts)


def spec_decode_message(
    *,
    num_drafts: int,
    num_draft_tokens: int,
    num_accepted_tokens: int,
    accepted_per_pos: Sequence[int],
    interval_s: float,
) -> str:
    """The ``SpecDecoding metrics: ...`` line (spec_decode/metrics.py)."""
    mean_length = 1 + num_accepted_tokens / num_drafts if num_drafts else 1.0
    rates = ", ".join(
        f"{(accepted / num_drafts if num_drafts else 0.0):.3f}" for accepted in accepted_per_pos
    )
    draft_rate = num_accepted_tokens / num_draft_tokens * 100 if num_draft_tokens else 0.0
    return (
        f"SpecDecoding metrics: Mean acceptance length: {mean_length:.2f}, "
        f"Accepted throughput: {num_accepted_tokens / interval_s:.2f} tokens/s, "
        f"Drafted throughput: {num_draft_tokens / interval_s:.2f} tokens/s, "
        f"Accepted: {num_accepted_tokens} tokens, Drafted: {num_draft_tokens} tokens, "
        f"Per-position acceptance rate: {rates}, Avg Draft acceptance rate: {draft_rate:.1f}%"
    )


def traceback_text(frames: Sequence[tuple[str, int, str, str]], error: str) -> str:
    """A Python traceback: frames are (file, line, function, code)."""
    lines = ["Traceback (most recent call last):"]
    for file, line, function, code in frames:
        lines.append(f'  File "{file}", line {line}, in {function}')
        lines.append(f"    {code}")
    lines.append(error)
    return "\n".join(lines)


# The frames vLLM 0.33 shows for the two fatal paths the simulator reproduces.
ENGINE_INIT_FRAMES = (
    (
        "<site-packages>/vllm/v1/engine/core.py",
        1540,
        "run_engine_core",
        "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    ),
    (
        "<site-packages>/vllm/v1/engine/core.py",
        157,
        "__init__",
        "kv_cache_config = self._initialize_kv_caches(vllm_config)",
    ),
    (
        "<site-packages>/vllm/v1/engine/core.py",
        326,
        "_initialize_kv_caches",
        "kv_cache_configs = get_kv_cache_configs(",
    ),
)
ENGINE_BUSY_FRAMES = (
    (
        "<site-packages>/vllm/v1/engine/core.py",
        1551,
        "run_engine_core",
        "engine_core.run_busy_loop()",
    ),
    (
        "<site-packages>/vllm/v1/engine/core.py",
        1012,
        "run_busy_loop",
        "self._process_engine_step()",
    ),
    (
        "<site-packages>/vllm/v1/engine/core.py",
        1045,
        "_process_engine_step",
        "outputs, model_executed = self.step_fn()",
    ),
)
OUTPUT_HANDLER_FRAMES = (
    (
        "<site-packages>/vllm/v1/engine/async_llm.py",
        886,
        "output_handler",
        "outputs = await engine_core.get_output_async()",
    ),
    (
        "<site-packages>/vllm/v1/engine/core_client.py",
        1235,
        "get_output_async",
        "raise self._format_exception(outputs) from None",
    ),
)
API_STARTUP_FRAMES = (
    (
        "<site-packages>/vllm/entrypoints/launchers/api_server/entry.py",
        177,
        "run_server",
        "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
    ),
    (
        "<site-packages>/vllm/v1/engine/utils.py",
        1351,
        "launch_core_engines",
        "wait_for_engine_startup(",
    ),
    (
        "<site-packages>/vllm/v1/engine/utils.py",
        1474,
        "wait_for_engine_startup",
        "raise RuntimeError(",
    ),
)
CONFIG_FRAMES = (
    (
        "<site-packages>/vllm/engine/arg_utils.py",
        1873,
        "create_engine_config",
        "model_config = self.create_model_config()",
    ),
)
ENGINE_DEAD_ERROR = (
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)
ENGINE_INIT_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore': 1}"
)
