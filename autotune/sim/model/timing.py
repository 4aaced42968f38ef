"""How long one engine step takes: a roofline over the step's bytes and FLOPs.

The scheduler (scheduler.py) describes each step as a ``StepShape`` and asks a
``StepTimeModel`` for its duration, so a calibrated model (a lookup table, a
regression on real traces) can replace ``RooflineTimeModel`` without touching
the scheduler.

The roofline: bytes streamed from HBM (weights once per step, KV of every
context token, linear-attention state read and written per sequence) over
bandwidth, against FLOPs (2 per GEMM parameter per token, plus attention) over
tensor throughput, the two overlapping imperfectly. Fixed costs: a per-step launch
overhead (larger without CUDA graphs), a per-sequence CPU cost, one pass of
the draft head per speculative token, and PCIe copies of external (LMCache)
prefix hits. The host's output stage (API server and client, per streamed
chunk) runs beside the engine, so a step takes at least its time. The
constants (efficiencies, overheads) are a ``SpeedConstants`` value: the
defaults, or a calibration profile's.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from autotune.catalog.hardware import GpuSpec
from autotune.catalog.models import ModelSpec
from autotune.sim.model.memory import MemoryReport
from autotune.sim.model.speed_constants import DEFAULT_CONSTANTS, SpeedConstants


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes."""

    num_seqs: int  # sequences in the batch
    num_prefill_tokens: int  # prompt tokens computed (not cached)
    num_decode_tokens: int  # decode tokens, speculative verify tokens included
    context_tokens: int  # KV tokens read (each sequence's context before this step)
    attention_pairs: float  # query x key pairs over all sequences
    num_spec_seqs: int = 0  # decode sequences that draft this step
    num_draft_passes: int = 0  # draft-head forwards (k when any sequence drafts)
    external_load_tokens: int = 0  # prefix tokens copied in from host memory (LMCache)
    num_output_seqs: int | None = None  # sequences emitting tokens (None: all of them)
    # Positions whose logits are computed: every decode (verify) token, plus the last prompt
    # token of each sequence whose prefill completes (None: every token).
    num_logit_tokens: int | None = None

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


@dataclass(frozen=True)
class DecodeSteps:
    """Consecutive plain decode steps of one batch: every sequence computes one token
    plus ``num_drafts`` drafts; only the context grows from one step to the next."""

    num_seqs: int
    num_drafts: int  # MTP drafts per sequence and step (0: no speculation)
    context_tokens: np.ndarray  # int64: the batch's context before each step

    def shape(self, index: int) -> StepShape:
        """Step ``index`` as the scheduler's ``step()`` describes it."""
        per_seq = 1 + self.num_drafts
        context = int(self.context_tokens[index])
        return StepShape(
            num_seqs=self.num_seqs,
            num_prefill_tokens=0,
            num_decode_tokens=self.num_seqs * per_seq,
            context_tokens=context,
            attention_pairs=per_seq * (context + self.num_seqs * per_seq / 2),
            num_spec_seqs=self.num_seqs if self.num_drafts else 0,
            num_draft_passes=self.num_drafts,
        )


class StepTimeModel(Protocol):
    """Anything that turns a step into seconds of modelled GPU time."""

    def step_time_s(self, shape: StepShape) -> float: ...


def decode_times_s(model: StepTimeModel, steps: DecodeSteps) -> np.ndarray:
    """Each step's duration: the model's own batch form when it has one (the same
    floats), else ``step_time_s`` step by step."""
    batch = getattr(model, "decode_times_s", None)
    if batch is not None:
        return batch(steps)
    count = len(steps.context_tokens)
    return np.array([model.step_time_s(steps.shape(i)) for i in range(count)], dtype=np.float64)


class RooflineTimeModel:
    """The default step-time model; see the module docstring."""

    def __init__(
        self,
        gpu: GpuSpec,
        model: ModelSpec,
        memory: MemoryReport,
        *,
        enforce_eager: bool,
        constants: SpeedConstants = DEFAULT_CONSTANTS,
    ) -> None:
        self._model = model
        self._memory = memory
        self._constants = constants
        self._bandwidth = gpu.bandwidth_bytes_s * constants.bandwidth_efficiency
        self._pcie = gpu.pcie_bytes_s
        # Tensor parallelism: each of ``tp`` ranks streams its shard of the weights (its KV
        # heads are in ``memory``'s per-rank sizes) and computes its share of the FLOPs (as a
        # peak ``tp`` times higher), then all-reduces twice a layer (``_all_reduce_s``).
        tp = memory.tensor_parallel_size
        peak_flops = gpu.fp8_flops if model.weight_format == "fp8" else gpu.bf16_flops
        self._peak_flops = peak_flops * tp
        self._weight_stream_bytes = (model.weights_bytes - model.embedding_bytes) // tp
        self._all_reduces = 2 * model.num_layers if tp > 1 else 0
        self._all_reduce_latency_s = gpu.interconnect_latency_s
        # Ring all-reduce: each rank sends and receives 2 (tp - 1) / tp of the bf16 activations.
        self._all_reduce_s_per_token = (
            2 * (tp - 1) / tp * model.hidden_size * 2 / gpu.interconnect_bytes_s
        )
        self._capture_sizes = list(memory.cudagraph_capture_sizes)
        self.token_counts: set[int] = set()  # every step's token count, before padding
        self._eager_overhead_s = constants.eager_overhead_per_layer_s * model.num_layers
        self._enforce_eager = enforce_eager
        # Attention FLOPs per query-key pair: QK^T and PV, 2 FLOPs per multiply-add.
        num_attention = model.num_full_attention_layers
        self._attn_flops_per_pair = 4 * num_attention * model.num_attention_heads * model.head_dim
        # vLLM computes logits only at the positions it samples (gpu_model_runner's
        # logits_indices: each request's last scheduled token, every speculative position),
        # so the lm_head GEMM runs over those, not over a prompt chunk's every token.
        self._lm_head_params = model.vocab_size * model.hidden_size
        self._body_params = model.matmul_params - self._lm_head_params
        self._linear_flops_per_token = (
            4
            * model.num_linear_attention_layers
            * model.linear_num_value_heads
            * model.linear_key_head_dim
            * model.linear_value_head_dim
        )

    def _padded_tokens(self, num_tokens: int, has_prefill: bool) -> tuple[int, float]:
        """Tokens actually computed (CUDA-graph padding) and the launch overhead."""
        constants = self._constants
        self.token_counts.add(num_tokens)
        eager_s = constants.step_overhead_s + self._eager_overhead_s
        if self._enforce_eager or not self._capture_sizes:
            return num_tokens, eager_s
        index = bisect.bisect_left(self._capture_sizes, num_tokens)
        if index == len(self._capture_sizes):
            return num_tokens, eager_s
        padded = self._capture_sizes[index]
        piecewise_s = constants.piecewise_overhead_s if has_prefill else 0.0
        return padded, constants.step_overhead_s + piecewise_s

    def _all_reduce_s(self, tokens: int) -> float:
        """The step's tensor-parallel all-reduces of ``tokens`` rows."""
        return self._all_reduces * (
            self._all_reduce_latency_s + tokens * self._all_reduce_s_per_token
        )

    def _compute_s(self, flops: float, prefill_share: float = 0.0) -> float:
        """FLOPs over the peak; the prompt's share at the prefill efficiency."""
        constants = self._constants
        decode_s = flops * (1.0 - prefill_share) / (self._peak_flops * constants.compute_efficiency)
        if not prefill_share:
            return decode_s
        peak = self._peak_flops * constants.prefill_compute_efficiency
        return decode_s + flops * prefill_share / peak

    def step_time_s(self, shape: StepShape) -> float:
        if shape.num_seqs == 0:
            return 0.0
        memory = self._memory
        tokens, overhead_s = self._padded_tokens(shape.num_tokens, shape.num_prefill_tokens > 0)
        state_writes = 1 + (memory.num_speculative_tokens if shape.num_spec_seqs else 0)
        bytes_moved = (
            self._weight_stream_bytes
            + (shape.context_tokens + shape.num_tokens) * memory.attention_bytes_per_token
            + shape.num_seqs * memory.state_bytes_per_request * (1 + state_writes)
        )
        logit_tokens = (
            shape.num_tokens if shape.num_logit_tokens is None else shape.num_logit_tokens
        )
        flops = (
            2 * self._body_params * tokens
            + 2 * self._lm_head_params * logit_tokens
            + self._attn_flops_per_pair * shape.attention_pairs
            + self._linear_flops_per_token * tokens
        )
        constants = self._constants
        memory_s = bytes_moved / self._bandwidth
        compute_s = self._compute_s(flops, shape.num_prefill_tokens / max(1, shape.num_tokens))
        time_s = max(memory_s, compute_s) + constants.overlap_penalty * min(memory_s, compute_s)
        time_s += overhead_s + constants.per_seq_overhead_s * shape.num_seqs
        if self._all_reduces:
            time_s += self._all_reduce_s(tokens)
        if shape.num_draft_passes:
            draft_bytes = self._model.mtp_draft_read_bytes
            draft_memory_s = draft_bytes / self._bandwidth
            # Each draft pass runs the head over every drafting sequence (2 FLOPs per param).
            draft_compute_s = self._compute_s(draft_bytes * shape.num_spec_seqs)
            time_s += shape.num_draft_passes * (
                max(draft_memory_s, draft_compute_s)
                + constants.draft_pass_overhead_s
                + constants.spec_per_seq_overhead_s * shape.num_spec_seqs
            )
        if shape.external_load_tokens:
            time_s += shape.external_load_tokens * memory.attention_bytes_per_token / self._pcie
        # The host's output stage runs beside the engine: the slower of the two sets the pace.
        emitting = shape.num_seqs if shape.num_output_seqs is None else shape.num_output_seqs
        return max(time_s, constants.host_per_output_s * emitting)

    def decode_times_s(self, steps: DecodeSteps) -> np.ndarray:
        """``step_time_s`` of every step of ``steps`` at once, bit for bit: the same
        operations in the same order, on arrays over the steps (only the context differs
        between them, so every other term is computed once)."""
        memory, constants = self._memory, self._constants
        shape = steps.shape(0)
        num_tokens = shape.num_tokens
        tokens, overhead_s = self._padded_tokens(num_tokens, False)
        state_writes = 1 + (memory.num_speculative_tokens if shape.num_spec_seqs else 0)
        context = steps.context_tokens
        bytes_moved = (
            self._weight_stream_bytes
            + (context + num_tokens) * memory.attention_bytes_per_token
            + shape.num_seqs * memory.state_bytes_per_request * (1 + state_writes)
        )
        per_seq = 1 + steps.num_drafts
        pairs = per_seq * (context + steps.num_seqs * per_seq / 2)
        flops = (
            2 * self._body_params * tokens
            + 2 * self._lm_head_params * num_tokens
            + self._attn_flops_per_pair * pairs
            + self._linear_flops_per_token * tokens
        )
        memory_s = bytes_moved / self._bandwidth
        compute_s = self._compute_s(flops, 0 / max(1, num_tokens))
        time_s = np.maximum(memory_s, compute_s) + constants.overlap_penalty * np.minimum(
            memory_s, compute_s
        )
        time_s += overhead_s + constants.per_seq_overhead_s * shape.num_seqs
        if self._all_reduces:
            time_s += self._all_reduce_s(tokens)
        if shape.num_draft_passes:
            draft_bytes = self._model.mtp_draft_read_bytes
            draft_memory_s = draft_bytes / self._bandwidth
            draft_compute_s = self._compute_s(draft_bytes * shape.num_spec_seqs)
            time_s += shape.num_draft_passes * (
                max(draft_memory_s, draft_compute_s)
                + constants.draft_pass_overhead_s
                + constants.spec_per_seq_overhead_s * shape.num_spec_seqs
            )
        return np.maximum(time_s, constants.host_per_output_s * shape.num_seqs)
