"""Derived flags: vLLM flags computed from the searched parameters.

Each rule takes the flags built so far and a DeriveContext and returns the
flags it sets (a value of None removes a flag). Spaces name the rules they
use under ``derived:``. These encode the field notes' hand-tuning rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.config.trial_config import FlagValue

LMCACHE_CONNECTOR = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both"}


@dataclass(frozen=True)
class DeriveContext:
    """What a rule may read besides the flags: the raw parameters and engine facts."""

    params: dict[str, Any]
    attention_block_size: int | None = None  # "Setting attention block size to N tokens"


Derivation = Callable[[dict[str, FlagValue], DeriveContext], dict[str, FlagValue]]


def mtp_k(context: DeriveContext) -> int:
    """MTP speculative tokens of this trial (0: off)."""
    return int(context.params.get("mtp_k", 0) or 0)


def speculative_config(flags: dict[str, FlagValue], context: DeriveContext) -> dict[str, FlagValue]:
    """``--speculative-config`` for MTP with k draft tokens (none when k = 0)."""
    k = mtp_k(context)
    value = {"method": "mtp", "num_speculative_tokens": k} if k > 0 else None
    return {"speculative-config": value}


def capture_sizes(max_batch: int) -> list[int]:
    """CUDA-graph sizes up to ``max_batch``: 1, 2, 4, then multiples of 8, then the max.

    8 sequences with MTP 2 -> max_batch 24 -> [1, 2, 4, 8, 16, 24] (field notes).
    """
    sizes = [size for size in (1, 2, 4) if size <= max_batch]
    sizes += list(range(8, max_batch + 1, 8))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def cudagraph_capture_sizes(
    flags: dict[str, FlagValue], context: DeriveContext
) -> dict[str, FlagValue]:
    """Size the capture list from max-num-seqs x (k+1) instead of vLLM's long default."""
    if flags.get("enforce-eager") is True or flags.get("max-num-seqs") is None:
        return {}
    max_batch = int(flags["max-num-seqs"]) * (mtp_k(context) + 1)
    return {"compilation-config": {"cudagraph_capture_sizes": capture_sizes(max_batch)}}


def lmcache(flags: dict[str, FlagValue], context: DeriveContext) -> dict[str, FlagValue]:
    """LMCache on: the connector plus ``--mamba-cache-mode align`` (a no-op from 0.33)."""
    if not context.params.get("lmcache"):
        return {"kv-transfer-config": None, "mamba-cache-mode": None}
    return {"kv-transfer-config": dict(LMCACHE_CONNECTOR), "mamba-cache-mode": "align"}


def lmcache_mtp_batched_tokens(
    flags: dict[str, FlagValue], context: DeriveContext
) -> dict[str, FlagValue]:
    """With MTP and LMCache both on, max-num-batched-tokens must be 2N-1.

    N is the attention block size the engine reports; without it nothing changes.
    """
    if mtp_k(context) > 0 and context.params.get("lmcache") and context.attention_block_size:
        return {"max-num-batched-tokens": 2 * context.attention_block_size - 1}
    return {}


def _lmcache_with_mtp(params: dict[str, Any]) -> bool:
    return mtp_k(DeriveContext(params)) > 0 and bool(params.get("lmcache"))


# The derivations that read the attention block size, with when they do: a config none
# of them reads it for is the same whatever the block size (``derive_config`` skips
# deriving it again with the memory model's).
READS_BLOCK_SIZE: dict[str, Callable[[dict[str, Any]], bool]] = {
    "lmcache_mtp_batched_tokens": _lmcache_with_mtp,
}

DERIVATIONS: dict[str, Derivation] = {
    "speculative_config": speculative_config,
    "cudagraph_capture_sizes": cudagraph_capture_sizes,
    "lmcache": lmcache,
    "lmcache_mtp_batched_tokens": lmcache_mtp_batched_tokens,
}
