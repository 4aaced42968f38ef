"""Prefix caching by block hashes, as vLLM does it: chained, salted, LRU-evicted.

A block's hash covers its tokens and the hash of the block before it, so a hit
on block i implies a hit on every block before it; ``cache_salt`` enters the
first block only, so two salts never share anything. Entries referenced by a
running request are pinned; released entries stay cached (and count as free
memory) until the least recently used is evicted to make room.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

# Polynomial prefix hashing in wrapping uint64 arithmetic: a block's content hash is
# sum(token * Q**t); the hash of the prefix ending at block k is sum(h_j * P**(k-j)),
# computed for every k at once with modular inverse powers (P is odd, so invertible).
_Q = np.uint64(0x9E3779B97F4A7C15)
_P = np.uint64(0xC2B2AE3D27D4EB4F)
_P_INVERSE = np.uint64(pow(int(_P), -1, 1 << 64))


def _powers(base: np.uint64, count: int) -> np.ndarray:
    """[1, base, base**2, ...] (count values), wrapping at 2**64."""
    powers = np.full(count, base, dtype=np.uint64)
    powers[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(powers, dtype=np.uint64)


def _salt_hash(salt: str | None) -> int:
    if salt is None:
        return 0
    return int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=8).digest(), "little")


def block_hashes(token_ids: np.ndarray, block_size: int, *, salt: str | None = None) -> list[int]:
    """Chained hashes of every full block of ``token_ids``: hash k covers blocks 0..k.

    ``salt`` enters the first block only, so different salts share nothing.
    """
    num_blocks = len(token_ids) // block_size
    if num_blocks == 0:
        return []
    with np.errstate(over="ignore"):
        blocks = token_ids[: num_blocks * block_size].astype(np.uint64).reshape(num_blocks, -1)
        content = (blocks * _powers(_Q, block_size)).sum(axis=1, dtype=np.uint64)
        content[0] += np.uint64(_salt_hash(salt))
        weighted = np.cumsum(content * _powers(_P_INVERSE, num_blocks), dtype=np.uint64)
        chained = weighted * _powers(_P, num_blocks)
    return chained.tolist()


class PrefixCache:
    """Cached blocks keyed by hash, with reference counts and an LRU of free ones."""

    def __init__(self) -> None:
        self._refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._refs)

    @property
    def num_evictable(self) -> int:
        """Cached entries no running request uses (free memory that still hits)."""
        return len(self._evictable)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` are cached."""
        refs = self._refs
        for count, block_hash in enumerate(hashes):
            if block_hash not in refs:
                return count
        return len(hashes)

    def acquire(self, hashes: Sequence[int]) -> None:
        """Pin cached entries for a request (each must be cached)."""
        for block_hash in hashes:
            refs = self._refs[block_hash]
            if refs == 0:
                del self._evictable[block_hash]
            self._refs[block_hash] = refs + 1

    def insert(self, block_hash: int) -> bool:
        """Cache a block a request just filled, pinned by it; False if already cached."""
        refs = self._refs.get(block_hash)
        if refs is None:
            self._refs[block_hash] = 1
            return True
        if refs == 0:
            del self._evictable[block_hash]
        self._refs[block_hash] = refs + 1
        return False

    def release(self, hashes: Sequence[int]) -> None:
        """Unpin a request's entries; the last release makes an entry evictable (most recent)."""
        for block_hash in reversed(hashes):  # tail blocks are evicted before their prefix
            refs = self._refs[block_hash] - 1
            self._refs[block_hash] = refs
            if refs == 0:
                self._evictable[block_hash] = None

    def evict(self, count: int) -> int:
        """Drop up to ``count`` least recently used free entries; returns how many."""
        evicted = 0
        while evicted < count and self._evictable:
            block_hash, _ = self._evictable.popitem(last=False)
            del self._refs[block_hash]
            evicted += 1
        return evicted

    def clear(self) -> int:
        """Drop every free entry (``/reset_prefix_cache``); returns how many."""
        return self.evict(len(self._evictable))


class HostPrefixStore:
    """LMCache's host-RAM copy of computed blocks (unbounded, FIFO-evicted when capped)."""

    def __init__(self, capacity_blocks: int | None = None) -> None:
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._capacity = capacity_blocks

    def match(self, hashes: Sequence[int], start: int) -> int:
        """How many of ``hashes[start:]`` are stored, consecutively from ``start``."""
        count = 0
        for block_hash in hashes[start:]:
            if block_hash not in self._blocks:
                break
            count += 1
        return count

    def store(self, hashes: Sequence[int]) -> None:
        for block_hash in hashes:
            self._blocks[block_hash] = None
        if self._capacity is not None:
            while len(self._blocks) > self._capacity:
                self._blocks.popitem(last=False)
