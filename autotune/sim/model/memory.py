"""The simulated GPU's memory budget: what a configuration needs, and whether it starts.

Startup follows vLLM's order: load weights, profile a dummy batch (peak
activation), allocate the KV pool, capture CUDA graphs. Any phase that needs
more than the free memory fails as ``cuda-oom-startup``; a KV pool too small
for one max-length request fails as ``kv-does-not-fit``, with vLLM's own
text. What stays free afterwards (``headroom_bytes``) is what a large prefill's
transient activations may use at run time before the engine dies.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from autotune.catalog.hardware import DEFAULT_MAX_CUDAGRAPH_CAPTURE_SIZE, GpuSpec, get_gpu
from autotune.catalog.models import ModelSpec, get_model
from autotune.errors import InputError
from autotune.sim.model.config import SimConfig
from autotune.sim.model.kv_layout import KvLayout, plan_layout
from autotune.sim.model.units import GIB, MIB
from autotune.vocabulary import FailureClass

LMCACHE_GPU_BYTES = int(0.9 * GIB)  # field notes: LMCache costs about 0.9 GiB per vLLM
SUGGESTION_MARGIN_BYTES = 150 * MIB  # gpu_worker.py: the --kv-cache-memory suggestion margin
CONSERVING_MEMORY_URL = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
_GDN_CHECKPOINT_FAMILIES = {"hopper", "blackwell"}  # FlashInfer GDN prefill (align 64)


class MemoryPerturbation(BaseModel):
    """Factors on the memory model's own constants, for a memory that is not the model's
    (a benchmark's truth); the default plan uses none."""

    model_config = ConfigDict(frozen=True)

    activation: float = Field(default=1.0, gt=0)  # the profiled peak activation
    cudagraph: float = Field(default=1.0, gt=0)  # CUDA-graph capture memory
    non_torch: float = Field(default=1.0, gt=0)  # the driver's and NCCL's memory
    per_seq: float = Field(default=1.0, gt=0)  # sampler buffers per sequence


class MemoryReport(BaseModel):
    """The memory plan of one configuration. All sizes in bytes."""

    model_config = ConfigDict(frozen=True)

    fits: bool
    failure_class: str | None = None  # "kv-does-not-fit" | "cuda-oom-startup" | None
    failure_message: str | None = None  # vLLM's own error text
    total_bytes: int  # the board's memory
    visible_bytes: int  # what CUDA reports as total
    free_at_startup_bytes: int
    requested_bytes: int  # ceil(visible * gpu_memory_utilization)
    weights_bytes: int  # language model + vision tower + draft head, as loaded
    vision_bytes: int
    peak_activation_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    lmcache_bytes: int
    kv_cache_bytes: int
    headroom_bytes: int  # free after startup: room for run-time transients
    kv_cache_tokens: int  # "GPU KV cache size: N tokens"
    max_concurrency: float  # "Maximum concurrency for L tokens per request: Xx"
    attention_block_size: int | None  # "Setting attention block size to N tokens"
    mamba_page_padding_pct: float | None = None
    block_size: int
    num_gpu_blocks: int
    bytes_per_block: int = 0
    transient_prefill_bytes_per_token: float  # activation per scheduled token at run time
    transient_bytes_per_seq: float = 0.0  # sampler buffers per scheduled sequence
    # Effective settings (vLLM's defaults resolved), for logs and /v1/models.
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    cudagraph_capture_sizes: list[int]
    num_speculative_tokens: int = 0
    tensor_parallel_size: int = 1  # sizes above are one rank's
    kv_cache_dtype: str = "auto"
    # Geometry the scheduler needs.
    num_attention_groups: int = 1
    state_blocks_per_request: int = 0
    attention_bytes_per_token: int = 0
    state_bytes_per_request: int = 0

    @property
    def longest_context_tokens(self) -> int:
        """The longest context one request can hold in this pool (vLLM keeps a null block)."""
        if not self.bytes_per_block or not self.num_attention_groups:
            return 0
        num_blocks = self.kv_cache_bytes // self.bytes_per_block
        attention_blocks = num_blocks - 1 - self.state_blocks_per_request
        return max(attention_blocks // self.num_attention_groups, 0) * self.block_size

    @property
    def suggested_kv_cache_bytes(self) -> int:
        """vLLM's "--kv-cache-memory=M ... to fully utilize gpu memory"."""
        static = self.weights_bytes + self.non_torch_bytes + self.lmcache_bytes
        used = static + self.peak_activation_bytes + self.cudagraph_bytes
        return self.free_at_startup_bytes - used - SUGGESTION_MARGIN_BYTES


def batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """vLLM's (max_num_batched_tokens, max_num_seqs) when unset (arg_utils get_batch_defaults)."""
    if gpu.visible_bytes >= 160 * GIB:
        return 16384, 1024
    if gpu.visible_bytes >= 70 * GIB and gpu.family != "ampere":
        return 8192, 1024
    return 2048, 256


def default_capture_sizes(
    *, max_num_seqs: int, num_speculative_tokens: int, max_num_batched_tokens: int
) -> list[int]:
    """vLLM's default cudagraph_capture_sizes (config/vllm.py _set_cudagraph_sizes)."""
    largest = min(
        max_num_seqs * (1 + num_speculative_tokens) * 2, DEFAULT_MAX_CUDAGRAPH_CAPTURE_SIZE
    )
    largest = min(largest, max_num_batched_tokens)
    grid = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return [size for size in grid if size <= largest]


OTHER_PROCESS_PID = 424242  # the process torch names as holding memory (--fault-gpu-memory-held)


def torch_oom_text(
    tried_bytes: float, gpu: GpuSpec, free_bytes: float, other_process_bytes: int = 0
) -> str:
    """PyTorch's CUDA OOM message (torch 2.14 wording); it names other processes' memory."""
    in_use = gpu.visible_bytes - max(free_bytes, 0) - other_process_bytes
    others = (
        f"Process {OTHER_PROCESS_PID} has {other_process_bytes / GIB:.2f} GiB memory in use. "
        if other_process_bytes
        else ""
    )
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_bytes / GIB:.2f} "
        f"GiB. GPU 0 has a total capacity of {gpu.visible_bytes / GIB:.2f} GiB of which "
        f"{max(free_bytes, 0) / MIB:.2f} MiB is free. {others}"
        "Including non-PyTorch memory, this process "
        f"has {in_use / GIB:.2f} GiB memory in use. If reserved but unallocated memory is large "
        "try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def _kv_does_not_fit_text(
    layout: KvLayout, kv_bytes: int, num_blocks: int, max_model_len: int
) -> str:
    if kv_bytes <= 0 or num_blocks <= 1:
        return (
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
            "memory reservation on the CPU backend, despite its name). See "
            f"{CONSERVING_MEMORY_URL} for more details."
        )
    needed = layout.blocks_for_tokens(max_model_len) * layout.bytes_per_block
    available = kv_bytes - layout.bytes_per_block
    estimate = layout.max_model_len_for(num_blocks - 1)
    return (
        "ValueError: To serve at least one request with the model's max seq len "
        f"({max_model_len}), ({needed / GIB:.2f} GiB KV cache is needed, which is larger than "
        f"the available KV cache memory ({available / GIB:.2f} GiB). Based on the available "
        f"memory, the estimated maximum model length is {estimate}. Try increasing "
        "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
        f"decreasing `max_model_len` when initializing the engine. See {CONSERVING_MEMORY_URL} "
        "for more details."
    )


def _validate(config: SimConfig, model: ModelSpec, max_model_len: int) -> None:
    if max_model_len > model.native_max_model_len:
        raise InputError(
            f"User-specified max_model_len ({max_model_len}) is greater than the derived "
            f"max_model_len (max_position_embeddings={model.native_max_model_len} in model's "
            "config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    if config.num_speculative_tokens < 0:
        raise InputError(
            f"num_speculative_tokens must be >= 0, but got {config.num_speculative_tokens}"
        )
    if config.num_speculative_tokens > 0 and model.mtp_num_layers == 0:
        raise InputError(
            f"Unsupported speculative method: 'mtp' ({model.name} has no draft head in the "
            "simulator's catalog)"
        )
    tp = config.tensor_parallel_size
    if tp < 1 or model.num_attention_heads % tp:
        raise InputError(
            f"Total number of attention heads ({model.num_attention_heads}) must be divisible "
            f"by tensor parallel size ({tp})."
        )
    refusal = model.tensor_parallel_refusal(tp)  # the KV and Gated DeltaNet heads
    if refusal is not None:
        raise InputError(refusal)
    if not 0 < config.gpu_memory_utilization <= 1:
        raise InputError(
            "gpu_memory_utilization must be in (0, 1], but got "
            f"gpu_memory_utilization={config.gpu_memory_utilization}"
        )


def _resolve_batch(config: SimConfig, gpu: GpuSpec, max_model_len: int) -> tuple[int, int]:
    default_tokens, default_seqs = batch_defaults(gpu)
    max_num_seqs = config.max_num_seqs or default_seqs
    if config.max_num_batched_tokens is None:
        max_num_batched_tokens = min(default_tokens, max_num_seqs * max_model_len)
        max_num_seqs = min(max_num_seqs, max_num_batched_tokens)
    else:
        max_num_batched_tokens = config.max_num_batched_tokens
    if max_num_batched_tokens < max_num_seqs:
        raise InputError(
            f"max_num_batched_tokens ({max_num_batched_tokens}) must be greater than or equal to "
            f"max_num_seqs ({max_num_seqs})."
        )
    return max_num_seqs, max_num_batched_tokens


def per_rank_model(model: ModelSpec, tp: int) -> ModelSpec:
    """The part of ``model`` one of ``tp`` ranks holds: KV and GDN heads split as vLLM
    shards them (``get_num_kv_heads``: at least one KV head a rank, replicated below that)."""
    if tp == 1:
        return model
    return model.model_copy(
        update={
            "num_kv_heads": max(1, model.num_kv_heads // tp),
            "linear_num_key_heads": model.linear_num_key_heads // tp,
            "linear_num_value_heads": model.linear_num_value_heads // tp,
        }
    )


def plan_memory(
    config: SimConfig, *, held_bytes: int = 0, perturbation: MemoryPerturbation | None = None
) -> MemoryReport:
    """The memory plan of ``config`` (one GPU's, one rank's under tensor parallelism),
    with vLLM's failure when it does not start.

    ``held_bytes``: GPU memory another process still holds (a previous trial's
    server not yet gone). ``perturbation``: factors on the model's memory constants.
    Raises InputError for a configuration vLLM rejects before touching memory.
    """
    bias = perturbation or MemoryPerturbation()
    gpu = get_gpu(config.hardware)
    model = get_model(config.model)
    max_model_len = config.max_model_len or model.max_model_len
    _validate(config, model, max_model_len)
    max_num_seqs, max_num_batched_tokens = _resolve_batch(config, gpu, max_model_len)
    spec_tokens = config.num_speculative_tokens
    prefix_caching = (
        model.prefix_caching_default
        if config.enable_prefix_caching is None
        else config.enable_prefix_caching
    )
    if config.enforce_eager:
        capture_sizes: list[int] = []
    elif config.cudagraph_capture_sizes is not None:
        capture_sizes = sorted(config.cudagraph_capture_sizes)
    else:
        capture_sizes = default_capture_sizes(
            max_num_seqs=max_num_seqs,
            num_speculative_tokens=spec_tokens,
            max_num_batched_tokens=max_num_batched_tokens,
        )
    tp = config.tensor_parallel_size
    layout = plan_layout(
        per_rank_model(model, tp),
        kv_cache_dtype=config.kv_cache_dtype,
        num_speculative_tokens=spec_tokens,
        enable_prefix_caching=prefix_caching,
        block_size=config.block_size,
        gdn_checkpoint_align=gpu.family in _GDN_CHECKPOINT_FAMILIES,
    )

    vision = 0 if config.language_model_only else model.vision_bytes
    # Every weight is sharded over the ranks (embedding and lm_head vocab-parallel too).
    weights = (model.weights_bytes + vision + (model.mtp_head_bytes if spec_tokens else 0)) // tp
    activation = int(
        bias.activation
        * (
            model.activation_fixed_bytes
            + model.activation_bytes_per_token * max_num_batched_tokens
            + (0 if config.language_model_only else model.vision_activation_delta_bytes)
        )
        + bias.per_seq * model.sampler_bytes_per_seq * max_num_seqs
    )
    cudagraph = 0
    if capture_sizes:
        cudagraph = int(
            bias.cudagraph
            * (
                model.cudagraph_bytes_per_graph * len(capture_sizes)
                + model.cudagraph_bytes_per_token * max(capture_sizes)
            )
        )
    non_torch = int(gpu.non_torch_bytes * bias.non_torch)
    lmcache = LMCACHE_GPU_BYTES if config.lmcache else 0
    free = gpu.free_at_startup_bytes - held_bytes

    def torch_oom(tried_bytes: float, free_bytes: float) -> str:
        return torch_oom_text(tried_bytes, gpu, free_bytes, held_bytes)

    requested = math.ceil(gpu.visible_bytes * config.gpu_memory_utilization)
    static = weights + non_torch + lmcache

    failure: tuple[FailureClass, str] | None = None
    if config.kv_cache_memory_bytes is not None:
        kv_bytes = config.kv_cache_memory_bytes
    else:
        kv_bytes = requested - static - activation - cudagraph
        if requested > free:
            failure = (
                FailureClass.CUDA_OOM_STARTUP,
                f"ValueError: Free memory on device cuda:0 ({free / GIB:.2f}/"
                f"{gpu.visible_bytes / GIB:.2f} GiB) on startup is less than desired GPU memory "
                f"utilization ({config.gpu_memory_utilization}, {requested / GIB:.2f} GiB). "
                "Decrease GPU memory utilization or reduce GPU memory used by other processes.",
            )
    if failure is None and weights + non_torch > free:
        failure = (
            FailureClass.CUDA_OOM_STARTUP,
            "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization "
            "to free memory for weights, increasing --tensor-parallel-size, or using "
            f"--quantization. See {CONSERVING_MEMORY_URL} for more tips. (original error: "
            f"{torch_oom(weights - free + non_torch, 0)})",
        )
    elif failure is None and static + activation > free:
        failure = (
            FailureClass.CUDA_OOM_STARTUP,
            torch_oom(activation, free - static),
        )
    elif failure is None and static + kv_bytes > free and kv_bytes > 0:
        failure = (FailureClass.CUDA_OOM_STARTUP, torch_oom(kv_bytes, free - static))
    elif failure is None and static + max(kv_bytes, 0) + cudagraph > free:
        failure = (
            FailureClass.CUDA_OOM_STARTUP,
            torch_oom(cudagraph, free - static - kv_bytes),
        )

    num_blocks = max(kv_bytes, 0) // layout.bytes_per_block
    if failure is None and (
        num_blocks <= 1 or layout.blocks_for_tokens(max_model_len) > num_blocks - 1
    ):
        failure = (
            FailureClass.KV_DOES_NOT_FIT,
            _kv_does_not_fit_text(layout, kv_bytes, num_blocks, max_model_len),
        )
    fits = failure is None
    headroom = free - static - max(kv_bytes, 0) - cudagraph
    return MemoryReport(
        fits=fits,
        failure_class=None if failure is None else failure[0].value,
        failure_message=None if failure is None else failure[1],
        total_bytes=gpu.memory_bytes,
        visible_bytes=gpu.visible_bytes,
        free_at_startup_bytes=free,
        requested_bytes=requested,
        weights_bytes=weights,
        vision_bytes=vision,
        peak_activation_bytes=activation,
        non_torch_bytes=non_torch,
        cudagraph_bytes=cudagraph,
        lmcache_bytes=lmcache,
        kv_cache_bytes=max(kv_bytes, 0),
        headroom_bytes=headroom,
        kv_cache_tokens=layout.capacity_tokens(num_blocks, max_model_len) if fits else 0,
        max_concurrency=layout.max_concurrency(num_blocks, max_model_len) if fits else 0.0,
        attention_block_size=layout.attention_block_size,
        mamba_page_padding_pct=layout.mamba_page_padding_pct,
        block_size=layout.block_size,
        num_gpu_blocks=num_blocks if fits else 0,
        bytes_per_block=layout.bytes_per_block,
        transient_prefill_bytes_per_token=bias.activation * model.activation_bytes_per_token,
        transient_bytes_per_seq=bias.per_seq * model.sampler_bytes_per_seq,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=prefix_caching,
        cudagraph_capture_sizes=capture_sizes,
        num_speculative_tokens=spec_tokens,
        tensor_parallel_size=tp,
        kv_cache_dtype=config.kv_cache_dtype,
        num_attention_groups=layout.num_attention_groups,
        state_blocks_per_request=layout.state_blocks_per_request,
        attention_bytes_per_token=layout.attention_bytes_per_token,
        state_bytes_per_request=layout.state_bytes_per_request,
    )
