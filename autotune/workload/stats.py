"""Workload statistics: sizes, length distributions, ideal prefix-cache hit ratio, concurrency.

The prefix-hit ratio is what an infinite prefix cache with ``block_size``-token
blocks would reach replaying the plan in arrival order: for each request, the
longest run of leading full blocks already seen (hashed with their whole
prefix, as vLLM does) counts as hit. Token counts are of the rendered content
(system prompt and message texts; chat-template tokens are not counted).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from autotune.workload.builder import BILLING_HEADER_SOURCE_KEY
from autotune.workload.plan import Message, WorkloadPlan
from autotune.workload.tokenizer import Tokenizer, WordTokenizer

DEFAULT_STATS_BLOCK_SIZE = 16  # vLLM's default KV block size
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


class Distribution(BaseModel):
    """Percentiles (linear interpolation), mean, max and total of a count."""

    model_config = ConfigDict(frozen=True)

    p50: float
    p90: float
    p99: float
    mean: float
    max: int
    total: int

    @classmethod
    def of(cls, values: list[int]) -> Distribution:
        if not values:
            return cls(p50=0, p90=0, p99=0, mean=0, max=0, total=0)
        array = np.asarray(values, dtype=np.int64)
        p50, p90, p99 = np.percentile(array, [50, 90, 99])
        return cls(
            p50=float(p50),
            p90=float(p90),
            p99=float(p99),
            mean=float(array.mean()),
            max=int(array.max()),
            total=int(array.sum()),
        )


class WorkloadStats(BaseModel):
    """What ``autotune workload stats`` reports."""

    model_config = ConfigDict(frozen=True)

    name: str
    token_space: str
    requests: int
    sessions: int
    independent_requests: int
    threads: int
    input_tokens: Distribution
    output_tokens: Distribution
    prefix_hit_ratio: float  # infinite cache, block level
    block_size: int
    peak_concurrent_sessions: int
    duration_s: float  # first to last recorded arrival
    skipped_lines: int = 0  # invalid lines dropped by --skip-invalid
    # Recorded calls that carried Claude Code's per-request billing block (dropped here):
    # live, each of them missed the prefix cache from its first token.
    billing_header_requests: int = 0


class _PrefixCache:
    """Chained block hashes of every prompt seen so far (an infinite prefix cache)."""

    def __init__(self, tokenizer: Tokenizer, block_size: int) -> None:
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.seen: set[int] = set()
        self.encoded: dict[int, np.ndarray] = {}  # id(text object) -> token ids
        self._keep: list[str] = []  # keeps ids in ``encoded`` valid
        weights = np.arange(1, block_size + 1, dtype=np.uint64) * _MULTIPLIER
        self.weights = weights | np.uint64(1)

    def tokens(self, text: str) -> np.ndarray:
        cached = self.encoded.get(id(text))
        if cached is None:
            cached = np.asarray(self.tokenizer.encode(text), dtype=np.uint32)
            self.encoded[id(text)] = cached
            self._keep.append(text)
        return cached

    def hit_tokens(self, system: str | None, messages: tuple[Message, ...]) -> int:
        """Leading tokens of this prompt found in the cache; then adds the prompt to it."""
        parts = [self.tokens(system)] if system else []
        parts.extend(self.tokens(message.text) for message in messages)
        if not parts:
            return 0
        tokens = np.concatenate(parts).astype(np.uint64)
        blocks = len(tokens) // self.block_size
        if blocks == 0:
            return 0
        matrix = tokens[: blocks * self.block_size].reshape(blocks, self.block_size)
        with np.errstate(over="ignore"):
            content = (matrix * self.weights).sum(axis=1, dtype=np.uint64)
            positions = np.arange(1, blocks + 1, dtype=np.uint64) * _MULTIPLIER
            chained = np.cumsum(content * (positions | np.uint64(1)), dtype=np.uint64)
        hashes = chained.tolist()
        low, high = 0, blocks  # hits form a prefix: find how many leading blocks are seen
        while low < high:
            mid = (low + high) // 2
            if hashes[mid] in self.seen:
                low = mid + 1
            else:
                high = mid
        self.seen.update(hashes[low:])
        return low * self.block_size


def _peak_concurrency(intervals: list[tuple[float, float]]) -> int:
    events = [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals]
    events.sort(key=lambda event: (event[0], -event[1]))  # a start at t overlaps an end at t
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def workload_stats(
    plan: WorkloadPlan,
    *,
    block_size: int = DEFAULT_STATS_BLOCK_SIZE,
    tokenizer: Tokenizer | None = None,
) -> WorkloadStats:
    """Summarise a plan. ``tokenizer`` must be the one the plan was expanded with."""
    cache = _PrefixCache(tokenizer or WordTokenizer(), block_size)
    hit_tokens = 0
    spans: dict[str, tuple[float, float]] = {}
    threads: set[tuple[str | None, str]] = set()
    for request in plan.requests:
        hit_tokens += cache.hit_tokens(request.system, request.messages)
        if request.session is not None:
            start, end = spans.get(request.session, (request.arrival_s, request.arrival_s))
            spans[request.session] = (min(start, request.arrival_s), max(end, request.arrival_s))
            threads.add((request.session, request.thread))
    inputs = [request.prompt_tokens for request in plan.requests]
    arrivals = [request.arrival_s for request in plan.requests]
    return WorkloadStats(
        name=plan.name,
        token_space=plan.token_space,
        requests=len(plan.requests),
        sessions=len(spans),
        independent_requests=sum(1 for request in plan.requests if request.session is None),
        threads=len(threads),
        input_tokens=Distribution.of(inputs),
        output_tokens=Distribution.of([request.output_tokens for request in plan.requests]),
        prefix_hit_ratio=hit_tokens / sum(inputs) if sum(inputs) else 0.0,
        block_size=block_size,
        peak_concurrent_sessions=_peak_concurrency(list(spans.values())),
        duration_s=(max(arrivals) - min(arrivals)) if arrivals else 0.0,
        skipped_lines=int(plan.metadata.get("skipped_lines", 0)),  # type: ignore[call-overload]  # set by expand
        billing_header_requests=_billing_header_requests(plan),
    )


def _billing_header_requests(plan: WorkloadPlan) -> int:
    source = plan.metadata.get("source")
    count = source.get(BILLING_HEADER_SOURCE_KEY, 0) if isinstance(source, dict) else 0
    return count if isinstance(count, int) else 0


class IdealPrefixHits:
    """The plan's ideal (infinite-cache) prefix-hit ratio per block size, computed once."""

    def __init__(self, plan: WorkloadPlan) -> None:
        self.plan = plan
        self._ratios: dict[int, float] = {}

    def ratio(self, block_size: int | None) -> float:
        size = block_size or 16
        if size not in self._ratios:
            self._ratios[size] = workload_stats(self.plan, block_size=size).prefix_hit_ratio
        return self._ratios[size]
