"""The words every package shares: outcomes, failures, startup and server reports, hardware.

This module is the bottom of the import graph: it imports nothing of ours, so
the simulator, the engines, the replayer, scoring and the study reader can
all speak of a ``Failure`` or an ``Outcome`` without depending on each other.
The string values are stored in studies; changing one breaks reading old ones.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class FailureClass(StrEnum):
    """Why a server did not start or died. Values are stored in studies."""

    INVALID_ARGS = "invalid-args"  # argparse rejected the argv (exit 2)
    KV_DOES_NOT_FIT = "kv-does-not-fit"  # "No available memory for the cache blocks" ...
    CUDA_OOM_STARTUP = "cuda-oom-startup"  # torch.OutOfMemoryError while starting
    CUDA_OOM_LOAD = "cuda-oom-load"  # torch.OutOfMemoryError while serving
    ENGINE_DEAD = "engine-dead"  # EngineDeadError / /health 503 while serving
    STARTUP_TIMEOUT = "startup-timeout"  # never became ready (a hang)
    PORT_IN_USE = "port-in-use"
    UNSUPPORTED_CONFIG = "unsupported-config"  # a flag/value this engine version rejects
    UNKNOWN = "unknown"  # anything else; the log tail is kept

    @property
    def is_oom(self) -> bool:
        return self in (
            FailureClass.KV_DOES_NOT_FIT,
            FailureClass.CUDA_OOM_STARTUP,
            FailureClass.CUDA_OOM_LOAD,
        )


class Outcome(StrEnum):
    """Trial outcome classes that are not engine failures (those are FailureClass values)."""

    OK = "ok"
    SLO_VIOLATED = "slo-violated"
    ERRORS = "errors"  # request error rate above the limit
    PREDICTED_OOM = "predicted-oom"  # the memory pre-screen said it cannot start
    RULE_VIOLATED = "rule-violated"  # the space's rules reject the config
    INTERRUPTED = "interrupted"
    OWN_ERROR = "error"  # autotune itself failed (a FAIL trial; the reason is stored)
    STORAGE_ERROR = "storage-error"  # the study's storage failed while the trial was recorded
    NO_REQUESTS = "no-requests"  # the replay completed nothing
    TRIAL_TIMEOUT = "trial-timeout"  # the trial ran past its time limit (--trial-timeout)
    DUPLICATE = "duplicate"  # the same launch as an earlier trial: its result, no launch
    PRUNED = "pruned"  # stopped early: its throughput so far was far below the best's


# A trial's stored outcome is an Outcome or a FailureClass value.
MEASURED_OUTCOMES = frozenset({Outcome.OK, Outcome.SLO_VIOLATED, Outcome.ERRORS})
OOM_OUTCOMES = frozenset({Outcome.PREDICTED_OOM, *(c for c in FailureClass if c.is_oom)})


class Failure(BaseModel):
    """A classified server failure, with the evidence kept."""

    model_config = ConfigDict(frozen=True)

    failure_class: FailureClass
    message: str  # one line: the decisive log line or a summary
    log_excerpt: str = ""  # the relevant lines (or the log tail for UNKNOWN)
    exit_code: int | None = None
    seconds: float | None = None  # from launch to the failure being seen


class StartupReport(BaseModel):
    """What the server said about itself while starting (parsed from its log)."""

    engine_version: str | None = None
    device: str | None = None  # "GPU" or "CPU", from "<device> KV cache size"
    kv_cache_tokens: int | None = None  # "GPU KV cache size: N tokens"
    max_concurrency: float | None = None  # "Maximum concurrency for L tokens per request: Xx"
    max_concurrency_tokens_per_request: int | None = None  # the L above
    attention_block_size: int | None = None  # "Setting attention block size to N tokens"
    weights_gib: float | None = None
    peak_activation_gib: float | None = None
    non_torch_gib: float | None = None
    cudagraph_gib: float | None = None
    kv_cache_gib: float | None = None
    model_load_s: float | None = None
    graph_capture_s: float | None = None
    ready_s: float | None = None  # launch to /health 200
    kv_cache_blocks: int | None = None  # vllm:cache_config_info num_gpu_blocks (cross-check)
    block_size: int | None = None  # vllm:cache_config_info block_size


class ServerStats(BaseModel):
    """Deltas and peaks of vLLM's Prometheus metrics over one replay.

    Rates are fractions in [0, 1]; None when the server does not expose the metric.
    """

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int | None = None  # vllm:prompt_tokens delta
    generation_tokens: int | None = None  # vllm:generation_tokens delta
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    prefix_cache_hit_rate: float | None = None
    external_prefix_cache_queries: int | None = None
    external_prefix_cache_hits: int | None = None
    external_prefix_cache_hit_rate: float | None = None  # LMCache / connector hits
    preemptions: int | None = None
    peak_kv_cache_usage: float | None = None  # vllm:kv_cache_usage_perc (0..1)
    peak_running: int | None = None
    peak_waiting: int | None = None
    spec_decode_drafts: int | None = None
    spec_decode_draft_tokens: int | None = None
    spec_decode_accepted_tokens: int | None = None
    spec_decode_acceptance_rate: float | None = None  # accepted / draft tokens
    spec_decode_mean_acceptance_length: float | None = None  # 1 + accepted / drafts
    # Accepted at draft position i / drafts (vLLM's per-position rate), one per position.
    spec_decode_acceptance_per_position: tuple[float, ...] | None = None
    kv_cache_tokens: int | None = None  # from vllm:cache_config_info labels
    block_size: int | None = None  # from vllm:cache_config_info labels
    prefix_caching_enabled: bool | None = None  # from vllm:cache_config_info labels
    scrapes: int = 0


class HardwareFingerprint(BaseModel):
    """The accelerator a study ran on (NVML for real GPUs, the catalog for the simulator)."""

    model_config = ConfigDict(frozen=True)

    gpu_name: str
    memory_bytes: int | None = None
    driver: str | None = None
    count: int = 1
    source: str = "nvml"  # "nvml" | "nvidia-smi" | "simulator" | "cpu"
