"""The startup sequence: modelled phase times and the log lines vLLM prints in each.

A launch takes realistic modelled time (API process, engine process, weight
loading at disk speed, torch.compile, KV profiling, CUDA-graph capture), each
phase slept as ``phase_s / time_scale`` of wall time and logged with vLLM's
wording, in vLLM's order. A configuration that does not fit fails where vLLM
fails (after loading and profiling) with vLLM's own error text, exit code 1.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from autotune.catalog.hardware import GpuSpec
from autotune.catalog.models import ModelSpec
from autotune.sim.model.memory import MemoryReport
from autotune.sim.server import logs
from autotune.sim.server.flags import ServeArgs
from autotune.sim.server.logs import VllmLog

# Modelled phase times (seconds), from vLLM startup logs on single consumer / datacenter
# GPUs: Python imports and config resolution, engine-process spawn, torch.compile
# (Dynamo + Inductor, warm compile cache), KV profiling, and per-size graph capture.
API_INIT_S = 6.0
ENGINE_INIT_S = 3.0
DISK_BYTES_S = 2.0e9  # safetensors from local NVMe, page cache cold
COMPILE_S = 22.0
PROFILE_S = 2.0
GRAPH_CAPTURE_S_PER_SIZE = 0.12  # two modes (FULL decode + PIECEWISE mixed) per size
SERVER_START_S = 1.0
LOAD_FAILURE = "Failed to load model - not enough GPU memory."
ROUTES = (
    ("/openapi.json", "GET, HEAD"),
    ("/docs", "GET, HEAD"),
    ("/load", "GET"),
    ("/version", "GET"),
    ("/health", "GET"),
    ("/metrics", "GET"),
    ("/tokenize", "POST"),
    ("/v1/models", "GET"),
    ("/ping", "GET"),
    ("/ping", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/messages", "POST"),
    ("/v1/messages/count_tokens", "POST"),
)


@dataclass(frozen=True)
class StartupPhases:
    """Modelled seconds of each startup phase."""

    api_init_s: float
    engine_init_s: float
    load_s: float
    compile_s: float
    profile_s: float
    graph_s: float
    server_s: float

    @property
    def total_s(self) -> float:
        return (
            self.api_init_s
            + self.engine_init_s
            + self.load_s
            + self.compile_s
            + self.profile_s
            + self.graph_s
            + self.server_s
        )


def startup_phases(args: ServeArgs, memory: MemoryReport | None) -> StartupPhases:
    """Phase times; ``--startup-s`` rescales them to that total."""
    eager = args.sim.enforce_eager
    phases = StartupPhases(
        api_init_s=API_INIT_S,
        engine_init_s=ENGINE_INIT_S,
        load_s=0.0 if memory is None else memory.weights_bytes / DISK_BYTES_S,
        compile_s=0.0 if eager else COMPILE_S,
        profile_s=PROFILE_S,
        graph_s=0.0
        if memory is None
        else GRAPH_CAPTURE_S_PER_SIZE * len(memory.cudagraph_capture_sizes),
        server_s=SERVER_START_S,
    )
    if args.startup_s is None:
        return phases
    factor = args.startup_s / phases.total_s
    return StartupPhases(*(value * factor for value in vars(phases).values()))


class StartupSequence:
    """Logs vLLM's startup lines phase by phase, sleeping each phase's scaled time."""

    def __init__(
        self,
        args: ServeArgs,
        log: VllmLog,
        *,
        model: ModelSpec,
        gpu: GpuSpec,
        memory: MemoryReport | None,
    ) -> None:
        self.args = args
        self.log = log
        self.model = model
        self.gpu = gpu
        self._memory = memory
        self.phases = startup_phases(args, memory)

    @property
    def memory(self) -> MemoryReport:
        if self._memory is None:
            raise RuntimeError("no memory plan: the configuration was rejected")
        return self._memory

    async def _phase(self, modelled_s: float) -> None:
        if modelled_s > 0:
            await asyncio.sleep(modelled_s / self.args.time_scale)

    @property
    def legacy(self) -> bool:
        """Whether to word lines as vLLM before 0.30 did (two KV lines, old summary)."""
        major, minor = (int(part) for part in self.args.vllm_version.split(".")[:2])
        return (major, minor) < (0, 30)

    async def api_process(self) -> None:
        """The API server's own startup, up to spawning the engine."""
        args, log = self.args, self.log
        for line in logs.banner_lines(args.vllm_version, args.sim.model):
            log.api("startup.py:16", line)
        log.api("startup.py:96", f"non-default args: {args.non_default_args}")
        for source, message in args.warnings:
            log.api(source, message, level="WARNING")
        await self._phase(self.phases.api_init_s)
        log.api("model.py:744", f"Resolved architecture: {self._architecture()}")
        if self._memory is None:
            return
        log.api("model.py:2170", f"Using max model len {self.memory.max_model_len}")
        if args.sim.kv_cache_dtype != "auto":
            log.api(
                "cache.py:361",
                f"Using {args.sim.kv_cache_dtype} data type to store kv cache. It reduces the GPU "
                "memory footprint and boosts the performance. Meanwhile, it may cause accuracy "
                "drop without a proper scaling factor",
            )
        log.api(
            "scheduler.py:310",
            "Chunked prefill is enabled with max_num_batched_tokens="
            f"{self.memory.max_num_batched_tokens}.",
        )
        if args.sim.enforce_eager:
            log.api(
                "vllm.py:1703",
                "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. "
                "This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
                "--kernel_config.enable_jit_warmup=False",
                level="WARNING",
            )

    def _architecture(self) -> str:
        return (
            "Qwen3_5ForConditionalGeneration"
            if self.model.kind == "hybrid-gdn"
            else ("Qwen3ForCausalLM" if "qwen" in self.model.name else "LlamaForCausalLM")
        )

    async def engine_until_loaded(self) -> None:
        """EngineCore: config line, block size, weight loading."""
        sim, log, memory = self.args.sim, self.log, self.memory
        spec = (
            f"SpeculativeConfig(method='mtp', num_spec_tokens={sim.num_speculative_tokens})"
            if sim.num_speculative_tokens
            else None
        )
        await self._phase(self.phases.engine_init_s)
        log.engine(
            "core.py:140",
            logs.engine_config_message(
                self.args.vllm_version,
                {
                    "model": repr(sim.model),
                    "speculative_config": spec,
                    "tokenizer": repr(sim.model),
                    "dtype": "torch.bfloat16",
                    "max_seq_len": memory.max_model_len,
                    "tensor_parallel_size": sim.tensor_parallel_size,
                    "quantization": self._quantization(),
                    "enforce_eager": sim.enforce_eager,
                    "kv_cache_dtype": sim.kv_cache_dtype,
                    "device_config": "cuda",
                    "seed": sim.seed,
                    "served_model_name": self.args.served_model_name,
                    "max_num_seqs": memory.max_num_seqs,
                    "enable_prefix_caching": memory.enable_prefix_caching,
                    "enable_chunked_prefill": True,
                },
            ),
        )
        if memory.attention_block_size is not None:
            log.engine(
                "interface.py:1109",
                f"Setting attention block size to {memory.attention_block_size} tokens to ensure "
                "that attention page size is >= mamba page size.",
            )
        if memory.mamba_page_padding_pct:
            log.engine(
                "interface.py:1133",
                f"Padding mamba page size by {memory.mamba_page_padding_pct:.2f}% to ensure that "
                "mamba page size and attention page size are exactly equal.",
            )
        log.engine("gpu_model_runner.py:4979", f"Starting to load model {sim.model}...")
        await self._phase(self.phases.load_s)
        log.engine(
            "default_loader.py:507", f"Loading weights took {self.phases.load_s:.2f} seconds"
        )
        loaded = memory.weights_bytes
        log.engine(
            "gpu_model_runner.py:5089",
            f"Model loading took {logs.gib(loaded):.2f} GiB memory and "
            f"{self.phases.load_s:.6f} seconds",
        )

    def _quantization(self) -> str | None:
        return {"int4": "awq_marlin", "fp8": "fp8"}.get(str(self.model.weight_format))

    async def engine_until_ready(self) -> None:
        """EngineCore: compile, KV sizing, graph capture, memory summary."""
        sim, log, memory, phases = self.args.sim, self.log, self.memory, self.phases
        if phases.compile_s:
            await self._phase(phases.compile_s)
            log.engine(
                "backends.py:1188",
                f"Dynamo bytecode transform time: {phases.compile_s * 0.3:.2f} s",
            )
            log.engine("monitor.py:20", f"torch.compile took {phases.compile_s:.2f} s in total")
        await self._phase(phases.profile_s)
        if sim.kv_cache_memory_bytes is not None:
            log.engine(
                "gpu_worker.py:664",
                logs.kv_reserved_message(self.gpu.free_at_startup_bytes, memory.kv_cache_bytes),
            )
        else:
            log.engine(
                "gpu_worker.py:773",
                f"Available KV cache memory: {logs.gib(memory.kv_cache_bytes)} GiB",
            )
        for line in logs.kv_capacity_lines(
            memory.kv_cache_tokens,
            memory.max_model_len,
            memory.max_concurrency,
            merged=not self.legacy,
        ):
            log.engine("kv_cache_utils.py:1148", line)
        if phases.graph_s:
            await self._phase(phases.graph_s)
            log.engine(
                "gpu_model_runner.py:6517",
                f"Graph capturing finished in {phases.graph_s:.0f} secs, took "
                f"{logs.gib(memory.cudagraph_bytes):.2f} GiB",
            )
        if sim.kv_cache_memory_bytes is None:
            log.engine(
                "gpu_worker.py:1045",
                logs.memory_summary_message(
                    free_bytes=self.gpu.free_at_startup_bytes,
                    total_bytes=memory.visible_bytes,
                    gpu_memory_utilization=sim.gpu_memory_utilization,
                    requested_bytes=memory.requested_bytes,
                    weights_bytes=memory.weights_bytes,
                    non_torch_bytes=memory.non_torch_bytes,
                    peak_activation_bytes=memory.peak_activation_bytes,
                    cudagraph_bytes=memory.cudagraph_bytes,
                    kv_cache_bytes=memory.kv_cache_bytes,
                    legacy=self.legacy,
                ),
            )
        init_s = phases.profile_s + phases.compile_s + phases.graph_s
        log.engine(
            "core.py:396",
            f"init engine (profile, create kv cache, warmup model) took {init_s:.2f} s",
        )

    def rejected(self, reason: str) -> None:
        """A configuration vLLM rejects while building its config (exit 1, no engine)."""
        self.log.raw(
            logs.traceback_text(
                logs.CONFIG_FRAMES,
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                f"ModelConfig\n  Value error, {reason} [type=value_error]",
            )
        )

    async def fail(self) -> None:
        """A configuration that does not fit: vLLM's error lines, after its delay.

        Weights that do not load fail right after loading (vLLM logs "Failed to
        load model ..." then re-raises torch's OOM); the rest after compiling and
        profiling, where vLLM sizes the KV cache.
        """
        log = self.log
        error = (
            self.memory.failure_message or "ValueError: No available memory for the cache blocks."
        )
        if error.startswith(LOAD_FAILURE):
            log.engine("gpu_model_runner.py:5077", error, level="ERROR")
            error = error.partition("(original error: ")[2].removesuffix(")") or error
        else:
            await self._phase(self.phases.compile_s + self.phases.profile_s)
        if not error.startswith(("ValueError", "torch.", "RuntimeError")):
            error = f"ValueError: {error}"
        log.engine(
            "core.py:1582",
            "EngineCore failed to start.\n" + logs.traceback_text(logs.ENGINE_INIT_FRAMES, error),
            level="ERROR",
        )
        log.raw("Process EngineCore:\n" + logs.traceback_text(logs.ENGINE_INIT_FRAMES, error))
        log.raw(logs.traceback_text(logs.API_STARTUP_FRAMES, logs.ENGINE_INIT_FAILED))

    def serving_lines(self, host: str, port: int) -> None:
        """API server: the lines between engine ready and uvicorn starting."""
        log = self.log
        log.api("entry.py:135", "Supported tasks: ['generate']")
        log.api("entry.py:139", f"Starting vLLM server on http://{host}:{port}")
        log.api("launcher.py:188", "Available routes are:")
        for path, methods in ROUTES:
            log.api("launcher.py:195", f"Route: {path}, Methods: {methods}")
