"""Prefix caching by block hashes, as vLLM does it: chained, salted, LRU-evicted.

A block's hash covers its tokens and the hash of the block before it, so a hit
on block i implies a hit on every block before it; ``cache_salt`` enters the
first block only, so two salts never share anything. Entries referenced by a
running request are pinned; released entries stay cached (and count as free
memory) until the least recently used is evicted to make room.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np


def block_hashes(
    token_ids: np.ndarray, block_size: int, *, salt: str | None = None, limit: int | None = None
) -> list[int]:
    """Chained hashes of every full block of ``token_ids`` (at most ``limit`` blocks)."""
    num_blocks = len(token_ids) // block_size
    if limit is not None:
        num_blocks = min(num_blocks, limit)
    data = token_ids.tobytes()
    width = block_size * token_ids.itemsize
    previous: object = ("salt", salt)
    hashes: list[int] = []
    for index in range(num_blocks):
        previous = hash((previous, data[index * width : (index + 1) * width]))
        hashes.append(previous)  # type: ignore[arg-type]  # an int from here on
    return hashes


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
