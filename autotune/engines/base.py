"""The one engine interface: launch a server for a TrialConfig, report, stop.

Real vLLM (``VllmEngine``) and the simulator (``SimEngine``) both implement
``BaseEngine``; the trial runner cannot tell them apart.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from autotune.trial_config import TrialConfig


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


class HardwareFingerprint(BaseModel):
    """The accelerator a study ran on (NVML for real GPUs, the catalog for the simulator)."""

    model_config = ConfigDict(frozen=True)

    gpu_name: str
    memory_bytes: int | None = None
    driver: str | None = None
    count: int = 1
    source: str = "nvml"  # "nvml" | "nvidia-smi" | "simulator" | "cpu"


class Server(ABC):
    """A running server, handed out by ``BaseEngine.launch``."""

    url: str  # base URL, e.g. http://127.0.0.1:8123
    report: StartupReport
    log_path: Path
    served_model_name: str
    time_scale: float  # >1 when the server runs faster than modelled time (simulator)
    api_key: str | None

    @abstractmethod
    def poll_failure(self) -> Failure | None:
        """A failure seen so far while serving (process gone, fatal log line), else None.

        Non-blocking; safe to call at any time, including after the replay.
        """


PhaseCallback = Callable[[str], None]


class BaseEngine(ABC):
    """Launches servers. Knows nothing of workloads or studies."""

    name: str  # "sim" | "vllm"

    @abstractmethod
    def version(self) -> str:
        """The engine version string (stored with every trial)."""

    @abstractmethod
    def hardware(self) -> HardwareFingerprint:
        """The hardware this engine runs on."""

    @abstractmethod
    def launch(
        self,
        config: TrialConfig,
        *,
        log_path: Path,
        startup_timeout_s: float,
        on_phase: PhaseCallback | None = None,
    ) -> AbstractAsyncContextManager[Server]:
        """Start a server; the context manager stops it (and its process group) on exit.

        Raises ``ServerStartFailed`` (carrying a ``Failure``) when it does not come up.
        """
