"""The engine's KV block pool: per-request blocks, prefix-cache entries, LMCache's copy.

Mirrors vLLM's KV cache manager in block counts: a request holds
``num_attention_groups`` blocks per ``block_size`` tokens of context plus its
linear-attention state blocks; filled prompt blocks become shared prefix-cache
entries; unpinned entries count as free and are evicted LRU when a request
needs room. The scheduler (scheduler.py) decides who gets blocks; this module
only keeps the books.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.sim.model.memory import MemoryReport
from autotune.sim.model.prefix_cache import HostPrefixStore, PrefixCache, block_hashes

# Prefix-cache bookkeeping granularity: vLLM hashes every block, but a dense model's
# 16-token blocks would cost thousands of Python dict operations per agent prompt, so
# entries cover whole blocks of at least this many tokens (hits are rounded down to it;
# hybrid models' attention blocks are larger, so they stay exact).
CACHE_UNIT_MIN_TOKENS = 256


@dataclass
class SimRequest:
    """A request as the engine sees it: token ids and lengths, no text."""

    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = True
    cache_salt: str | None = None
    arrival_s: float = 0.0  # informational: the engine schedules what it has been given
    # The prompt's chained hashes per cache unit size (``block_hashes`` with this salt),
    # from a caller that keeps them between engines (the predictor); None: computed here.
    prefix_hashes: Callable[[int], list[int]] | None = None


@dataclass(slots=True, eq=False)  # identity: the scheduler compares states by object
class RequestState:
    """Scheduler and block-pool state of one request."""

    request: SimRequest
    token_ids: np.ndarray
    num_prompt: int
    max_tokens: int
    num_computed: int = 0  # tokens whose KV is in the cache
    num_output: int = 0
    num_cached: int | None = None  # prefix hits at first admission (tokens)
    hashes: list[int] | None = None  # chained hashes of the full prompt cache units
    pinned: list[int] = field(default_factory=list)  # prefix-cache entries held
    num_positions: int = 0  # attention block positions held (pinned ones included)
    holds_state: bool = False  # linear-attention state blocks allocated
    draw: Callable[[], float] | None = None  # this request's own MTP acceptance stream
    uniforms: list[float] = field(default_factory=list)  # its draws, one per output position

    @property
    def num_known(self) -> int:
        return self.num_prompt + self.num_output


class KvCacheManager:
    """Block counts of one engine's KV pool (see the module docstring)."""

    def __init__(self, memory: MemoryReport, *, lmcache: bool) -> None:
        self.block_size = memory.block_size
        self._groups = memory.num_attention_groups
        self._unit_positions = max(1, math.ceil(CACHE_UNIT_MIN_TOKENS / self.block_size))
        self.unit_tokens = self._unit_positions * self.block_size  # one cache entry
        self._entry_blocks = self._unit_positions * self._groups
        self._state_blocks = memory.state_blocks_per_request
        self._total_blocks = max(memory.num_gpu_blocks - 1, 0)  # one null block
        self._private_blocks = 0
        # The most blocks any capacity check asked for (in use + needed): a pool at least
        # this large takes every decision this one took, so their schedules are the same.
        self.peak_demand_blocks = 0
        self.caching = memory.enable_prefix_caching
        self._cache = PrefixCache()
        self._host = HostPrefixStore() if lmcache else None

    @property
    def total_blocks(self) -> int:
        return self._total_blocks

    def _demand(self, in_use_blocks: int, needed_blocks: int) -> None:
        if in_use_blocks + needed_blocks > self.peak_demand_blocks:
            self.peak_demand_blocks = in_use_blocks + needed_blocks

    @property
    def has_host_store(self) -> bool:
        return self._host is not None

    def used_blocks(self) -> int:
        return self._private_blocks + len(self._cache) * self._entry_blocks

    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: blocks in use, cached-but-free ones excluded."""
        if not self._total_blocks:
            return 0.0
        in_use = self.used_blocks() - self._cache.num_evictable * self._entry_blocks
        return in_use / self._total_blocks

    def reset_prefix_cache(self) -> int:
        """Drop every unpinned cached entry; returns how many."""
        return self._cache.clear()

    # ---------------------------------------------------------------- blocks
    def _allocate(self, num_blocks: int) -> bool:
        used = self.used_blocks()
        self._demand(used, num_blocks)
        free = self._total_blocks - used
        if free < num_blocks:
            shortfall = math.ceil((num_blocks - free) / self._entry_blocks)
            if self._cache.num_evictable < shortfall:
                return False
            self._cache.evict(shortfall)
        self._private_blocks += num_blocks
        return True

    def holds(self, state: RequestState, num_tokens: int) -> bool:
        """Whether ``state`` already holds blocks for ``num_tokens`` of context."""
        return state.holds_state and num_tokens <= state.num_positions * self.block_size

    def _growth(self, state: RequestState, num_tokens: int) -> int:
        """The blocks ``state`` needs more to hold ``num_tokens`` of context."""
        positions = math.ceil(num_tokens / self.block_size)
        needed = (positions - state.num_positions) * self._groups
        return needed if state.holds_state else needed + self._state_blocks

    def grow(self, state: RequestState, num_tokens: int) -> bool:
        """Hold blocks for ``num_tokens`` of context (and the state blocks); False if full."""
        needed = self._growth(state, num_tokens)
        if needed > 0 and not self._allocate(needed):
            return False
        state.num_positions = max(math.ceil(num_tokens / self.block_size), state.num_positions)
        state.holds_state = True
        return True

    def can_grow(self, state: RequestState, num_tokens: int) -> bool:
        """Whether ``grow(state, num_tokens)`` would succeed (evicting if it must); changes
        nothing."""
        needed = self._growth(state, num_tokens)
        used = self.used_blocks()
        self._demand(used, needed)
        free = self._total_blocks - used
        if needed <= free:
            return True
        return self._cache.num_evictable >= math.ceil((needed - free) / self._entry_blocks)

    def free(self, state: RequestState) -> None:
        """Give back everything ``state`` holds; LMCache keeps its computed prompt blocks."""
        private = (state.num_positions - len(state.pinned) * self._unit_positions) * self._groups
        if state.holds_state:
            private += self._state_blocks
        self._private_blocks -= private
        if state.pinned:
            self._cache.release(state.pinned)
        if self._host is not None and state.hashes:
            self._host.store(state.hashes[: state.num_computed // self.unit_tokens])
        state.pinned = []
        state.num_positions = 0
        state.holds_state = False

    def cache_full_blocks(self, state: RequestState) -> None:
        """Turn the request's newly filled prompt units into shared cache entries."""
        hashes = state.hashes
        if not self.caching or hashes is None or len(state.pinned) == len(hashes):
            return
        filled = min(state.num_computed // self.unit_tokens, len(hashes))
        for index in range(len(state.pinned), filled):
            self._cache.insert(hashes[index])
            state.pinned.append(hashes[index])
            self._private_blocks -= self._entry_blocks  # now counted as a cache entry

    # ---------------------------------------------------------------- lookups
    def lookup(self, state: RequestState) -> tuple[int, int]:
        """(local, external) cache units a waiting request can skip; pins the local ones."""
        if state.hashes is None and (self.caching or self._host is not None):
            request = state.request
            if request.prefix_hashes is not None:
                state.hashes = request.prefix_hashes(self.unit_tokens)
            else:
                salt = request.cache_salt
                state.hashes = block_hashes(state.token_ids, self.unit_tokens, salt=salt)
        hashes = state.hashes or []
        max_hit = (state.num_known - 1) // self.unit_tokens  # one token is always computed
        candidates = hashes[: min(max_hit, len(hashes))]
        local = self._cache.match(candidates) if self.caching else 0
        external = self._host.match(candidates, local) if self._host is not None else 0
        if local:
            self._cache.acquire(candidates[:local])
            state.pinned = list(candidates[:local])
            state.num_positions = local * self._unit_positions
        return local, external

    def undo_lookup(self, state: RequestState) -> None:
        """Unpin what ``lookup`` pinned (the request was not admitted after all)."""
        if state.pinned:
            self._cache.release(state.pinned)
        state.pinned = []
        state.num_positions = 0

    # -------------------------------------------------------------- decode runs
    def steps_without_eviction(self, running: Sequence[RequestState], steps: int) -> int:
        """The most decode steps (<= ``steps``) whose new blocks fit in the free pool."""
        computed = np.fromiter((s.num_computed for s in running), np.int64, len(running))
        positions = np.fromiter((s.num_positions for s in running), np.int64, len(running))
        used = self.used_blocks()
        free = self._total_blocks - used

        def needed(count: int) -> int:
            grown = -(-(computed + count) // self.block_size) - positions
            return int(grown.clip(min=0).sum()) * self._groups

        needed_blocks = needed(steps)
        self._demand(used, needed_blocks)
        if needed_blocks <= free:
            return steps
        low, high = 0, steps  # needed(low) fits, needed(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            if needed(middle) <= free:
                low = middle
            else:
                high = middle
        return low

    def fits_decode(self, running: Sequence[RequestState], num_tokens: int) -> bool:
        """Whether every request can take ``num_tokens`` more without evicting anything."""
        needed = 0
        for state in running:
            positions = -(-(state.num_computed + num_tokens) // self.block_size)
            needed += max(0, positions - state.num_positions) * self._groups
        used = self.used_blocks()
        self._demand(used, needed)
        return needed <= self._total_blocks - used

    def decode_steps_that_fit(
        self, running: Sequence[RequestState], before: Sequence[Sequence[int]], num_tokens: int
    ) -> int:
        """How many of the coming decode steps can each give every request ``num_tokens``
        more without evicting (``before``: each request's context before each step), as
        ``fits_decode`` then ``grow`` step after step decide."""
        block_size = self.block_size
        used = self.used_blocks()
        free = (self._total_blocks - used) // self._groups  # in positions
        held = [state.num_positions for state in running]
        last = sum(
            max(0, -(-(tokens[-1] + num_tokens) // block_size) - positions)
            for tokens, positions in zip(before, held, strict=True)
        )
        self._demand(used, last * self._groups)
        if last <= free:  # the blocks only grow: if the last step fits, every step does
            return len(before[0]) if before else 0
        grown = 0
        for step, contexts in enumerate(zip(*before, strict=True)):
            for index, tokens in enumerate(contexts):
                needed = -(-(tokens + num_tokens) // block_size)
                if needed > held[index]:
                    grown += needed - held[index]
                    held[index] = needed
            if grown > free:
                return step
        return len(before[0])

    def grow_decode(self, running: Sequence[RequestState], num_tokens: Sequence[int]) -> None:
        """Hold blocks for ``num_tokens`` of context per request (checked to fit by
        ``decode_steps_that_fit``)."""
        for state, tokens in zip(running, num_tokens, strict=True):
            grown = self.grow(state, tokens)
            assert grown, "decode_steps_that_fit said these blocks fit"

    def decode_tokens(self, running: Sequence[RequestState], count: int) -> None:
        """Every request decoded ``count`` tokens (checked to fit by steps_without_eviction)."""
        for state in running:
            state.num_computed += count
            state.num_output += count
            positions = math.ceil(state.num_computed / self.block_size)
            if positions > state.num_positions:
                self._private_blocks += (positions - state.num_positions) * self._groups
                state.num_positions = positions
