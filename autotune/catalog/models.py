"""The model catalog (autotune/catalog/data/models.yaml) as typed specs."""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import BaseModel, ConfigDict

from autotune.catalog.hardware import load_catalog
from autotune.errors import InputError

CATALOG_FILE = "models.yaml"

WeightFormat = Literal["bf16", "fp8", "int4"]


class ModelSpec(BaseModel):
    """One model: architecture from its config.json, memory constants in bytes."""

    model_config = ConfigDict(frozen=True)

    name: str
    hf_id: str
    kind: Literal["dense", "hybrid-gdn"]
    num_layers: int
    num_full_attention_layers: int
    num_linear_attention_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    # Gated DeltaNet (linear attention) state dimensions; zero for dense models.
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    mamba_conv_dtype_bytes: int = 2
    mamba_ssm_dtype_bytes: int = 2
    weight_format: WeightFormat
    weights_bytes: int  # language model as loaded
    embedding_bytes: int  # part of weights_bytes not streamed per step
    matmul_params: float  # GEMM parameters each token passes through (2 FLOP each)
    vision_bytes: int = 0
    vision_activation_delta_bytes: int = 0
    mtp_num_layers: int = 0  # n_predict; 0: no draft head
    mtp_head_bytes: int = 0
    mtp_draft_read_bytes: int = 0  # bytes streamed per draft forward pass
    default_mtp_acceptance: list[float] = []
    # Per workload kind ("agent", "chat"; see predict.workload_kind), where evidence differs.
    mtp_acceptance_by_kind: dict[str, list[float]] = {}
    max_model_len: int
    native_max_model_len: int
    prefix_caching_default: bool = True
    activation_bytes_per_token: int
    sampler_bytes_per_seq: int
    activation_fixed_bytes: int = 0
    cudagraph_bytes_per_graph: int
    cudagraph_bytes_per_token: int

    @property
    def is_hybrid(self) -> bool:
        return self.num_linear_attention_layers > 0

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the GDN short convolution (q, k and v concatenated)."""
        return (
            self.linear_key_head_dim * self.linear_num_key_heads * 2
            + self.linear_value_head_dim * self.linear_num_value_heads
        )

    def tensor_parallel_refusal(self, tp: int) -> str | None:
        """Why vLLM refuses to shard this model over ``tp`` GPUs at start (None: it does
        not). Its QKVParallelLinear splits the attention heads over the ranks
        (``divide(num_attention_heads, tp)``) and splits the KV heads too, or replicates
        each over ``tp // num_kv_heads`` ranks when there are fewer, so one divides the
        other; its Gated DeltaNet layers split their key and value heads likewise."""
        heads = self.num_attention_heads
        if heads % tp:
            return f"{self.name} has {heads} attention heads, not divisible by {tp}"
        kv = self.num_kv_heads
        if kv % tp and tp % kv:
            return (
                f"{self.name} has {kv} KV heads: TP must divide them or be a multiple of them "
                "(each then replicated)"
            )
        for what, count in (
            ("key", self.linear_num_key_heads),
            ("value", self.linear_num_value_heads),
        ):
            if count and count % tp:
                return f"{self.name} has {count} Gated DeltaNet {what} heads, not divisible by {tp}"
        return None

    def linear_state_bytes(self, num_speculative_tokens: int = 0) -> int:
        """One GDN layer's per-request state: conv + recurrent (vLLM's mamba page)."""
        if not self.is_hybrid:
            return 0
        conv = (
            self.linear_conv_dim
            * (self.linear_conv_kernel_dim - 1 + num_speculative_tokens)
            * self.mamba_conv_dtype_bytes
        )
        recurrent = (
            self.linear_num_value_heads
            * self.linear_value_head_dim
            * self.linear_key_head_dim
            * self.mamba_ssm_dtype_bytes
        )
        return conv + recurrent


@functools.cache
def _model_catalog() -> dict[str, ModelSpec]:
    return load_catalog(CATALOG_FILE, ModelSpec)


def model_names() -> list[str]:
    """Names of every model in the catalog."""
    return list(_model_catalog())


def get_model(name: str) -> ModelSpec:
    """The catalog entry for ``name``; InputError naming the known models otherwise."""
    catalog = _model_catalog()
    spec = catalog.get(name)
    if spec is None:
        known = ", ".join(catalog)
        raise InputError(f"unknown model {name!r} (simulator model catalog: {known})")
    return spec
