"""How vLLM lays out the KV cache: page sizes, hybrid block alignment, groups, capacity.

Follows vLLM's own arithmetic (0.33.0 source): per-layer page sizes
(``vllm/v1/kv_cache_interface.py``), the hybrid attention/mamba page
unification (``_align_hybrid_block_size`` in ``vllm/platforms/interface.py``),
grouping by layer type and the shared block pool (``vllm/v1/core/kv_cache_planning.py``)
and the logged "KV cache size: N tokens" (``get_kv_cache_capacity`` in
``vllm/v1/core/kv_cache_utils.py``). docs/simulator.md checks it against real startups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.catalog.models import ModelSpec
from autotune.errors import InputError

DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
GDN_PREFILL_CHECKPOINT_ALIGN = 64  # gdn_attn.py: FlashInfer GDN prefill (Hopper+), align mode

_SIXTEEN_BIT = {"auto", "bfloat16", "float16"}
_ONE_BYTE = {
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "int8_per_token_head",
    "fp8_per_token_head",
}
# TurboQuant presets: (key bits, value bits); 8-bit keys are stored as FP8.
_TURBOQUANT = {
    "turboquant_k8v4": (8, 4),
    "turboquant_4bit_nc": (4, 4),
    "turboquant_k3v4_nc": (3, 4),
    "turboquant_3bit_nc": (3, 3),
}
_FOUR_BIT = {"int4_per_token_head", "nvfp4", "nvfp4_4over6", "ultraquant_4bit", "nvfp4_ds_mla"}
_OCTAVE = {"octave_k3v4": (3, 4), "octave_k3v3": (3, 3), "octave_k3v3_compact": (3, 3)}


def kv_bytes_per_head_token(kv_cache_dtype: str, head_dim: int) -> int:
    """Bytes of K+V for one KV head and one token in ``kv_cache_dtype``.

    Raises InputError with vLLM's text for an unknown dtype.
    """
    if kv_cache_dtype in _SIXTEEN_BIT:
        return 2 * head_dim * 2
    if kv_cache_dtype in _ONE_BYTE:
        return 2 * head_dim
    if kv_cache_dtype in _TURBOQUANT or kv_cache_dtype in _OCTAVE:
        k_bits, v_bits = (_TURBOQUANT | _OCTAVE)[kv_cache_dtype]
        key = head_dim if k_bits == 8 else math.ceil(head_dim * k_bits / 8) + 2
        value = math.ceil(head_dim * v_bits / 8) + 4
        return 2 * math.ceil((key + value) / 2)  # slot_size_aligned: even
    if kv_cache_dtype in _FOUR_BIT:
        return head_dim + 4  # two 4-bit halves plus per-token-head scales
    valid = sorted(_SIXTEEN_BIT | _ONE_BYTE | set(_TURBOQUANT) | _FOUR_BIT | set(_OCTAVE))
    raise InputError(f"Invalid kv_cache_dtype: {kv_cache_dtype!r}. Valid values are: {valid}")


@dataclass(frozen=True)
class KvLayout:
    """The block pool's geometry for one model and configuration."""

    block_size: int  # tokens per block (the attention block size on hybrid models)
    attention_block_size: int | None  # set when hybrid alignment enlarged the block
    mamba_page_padding_pct: float | None  # "Padding mamba page size by X%"
    page_bytes: int  # one layer's page: every layer has the same page on hybrid models
    group_size: int  # layers per KV cache group
    num_attention_groups: int
    num_state_groups: int  # GDN / mamba groups
    bytes_per_block: int  # group_size * page_bytes
    state_blocks_per_group: int  # per request: 1+k (no prefix caching) or 2+k (align)
    attention_bytes_per_token: int  # K+V of every attention layer, one token
    state_bytes_per_request: int  # every GDN layer's state, one request

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks one request of ``num_tokens`` context holds (state blocks included)."""
        attention = self.num_attention_groups * math.ceil(num_tokens / self.block_size)
        return attention + self.state_blocks_per_request

    @property
    def state_blocks_per_request(self) -> int:
        return self.num_state_groups * self.state_blocks_per_group

    def capacity_tokens(self, num_blocks: int, max_model_len: int) -> int:
        """vLLM's logged "KV cache size: N tokens" (kv_cache_utils.get_kv_cache_capacity)."""
        return int(self.max_concurrency(num_blocks, max_model_len) * max_model_len)

    def max_concurrency(self, num_blocks: int, max_model_len: int) -> float:
        return num_blocks / self.blocks_for_tokens(max_model_len)

    def max_model_len_for(self, num_blocks: int) -> int:
        """The longest context one request can have in ``num_blocks`` (0 if none)."""
        attention_blocks = num_blocks - self.state_blocks_per_request
        if attention_blocks < self.num_attention_groups:
            return 0
        return (attention_blocks // self.num_attention_groups) * self.block_size


def plan_layout(
    model: ModelSpec,
    *,
    kv_cache_dtype: str,
    num_speculative_tokens: int,
    enable_prefix_caching: bool,
    block_size: int | None,
    gdn_checkpoint_align: bool,
) -> KvLayout:
    """The layout vLLM chooses (platforms/interface.py, kv_cache_planning.py)."""
    # The MTP / EAGLE draft layer is a full-attention layer with its own KV cache.
    draft_layers = model.mtp_num_layers if num_speculative_tokens > 0 else 0
    num_attention = model.num_full_attention_layers + draft_layers
    attn_page_1tok = model.num_kv_heads * kv_bytes_per_head_token(kv_cache_dtype, model.head_dim)
    requested_block = block_size or DEFAULT_BLOCK_SIZE
    if not model.is_hybrid:
        page = requested_block * attn_page_1tok
        return KvLayout(
            block_size=requested_block,
            attention_block_size=None,
            mamba_page_padding_pct=None,
            page_bytes=page,
            group_size=num_attention,
            num_attention_groups=1,
            num_state_groups=0,
            bytes_per_block=num_attention * page,
            state_blocks_per_group=0,
            attention_bytes_per_token=num_attention * attn_page_1tok,
            state_bytes_per_request=0,
        )
    mamba_page = model.linear_state_bytes(num_speculative_tokens)
    align = requested_block
    if enable_prefix_caching and gdn_checkpoint_align:
        align = math.lcm(align, GDN_PREFILL_CHECKPOINT_ALIGN)
    attn_block = align * math.ceil(mamba_page / (align * attn_page_1tok))
    chosen = max(requested_block, attn_block)
    page = chosen * attn_page_1tok
    num_state = model.num_linear_attention_layers
    group_size = min(num_attention, num_state)
    if max(num_attention, num_state) < 1.5 * group_size:
        group_size = max(num_attention, num_state)
    per_group = (2 if enable_prefix_caching else 1) + num_speculative_tokens
    return KvLayout(
        block_size=chosen,
        attention_block_size=chosen if chosen > requested_block else None,
        mamba_page_padding_pct=100.0 * (page - mamba_page) / mamba_page,
        page_bytes=page,
        group_size=group_size,
        num_attention_groups=math.ceil(num_attention / group_size),
        num_state_groups=math.ceil(num_state / group_size),
        bytes_per_block=group_size * page,
        state_blocks_per_group=per_group,
        attention_bytes_per_token=num_attention * attn_page_1tok,
        state_bytes_per_request=num_state * mamba_page,
    )
