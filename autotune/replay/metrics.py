"""vLLM's /metrics (Prometheus text) -> ServerStats, and why a prefix cache missed.

Counters are deltas between a scrape before and one after the replay; gauges
(running, waiting, KV usage) are peaks over every scrape. Samples are summed
over engines (``engine`` label) except KV usage, whose peak is the fullest
engine's. Names are vLLM's V1 names (the families the simulator exports,
docs/sim-server.md), with the older ``gpu_`` names as fallbacks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from autotune.errors import ReplayError, ServerNotAnswering
from autotune.vocabulary import ServerStats

MetricSamples = dict[str, list[Sample]]

GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label position
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_CONFIG = "vllm:cache_config_info"
PEAK_GAUGES = (RUNNING, WAITING, *KV_USAGE)

# vLLM's API server answers /metrics in milliseconds however busy the GPU (the engine
# runs in another process); a scrape missed during a replay only loses one sample, so
# a short limit costs nothing and keeps a hung server from holding the replay.
SCRAPE_TIMEOUT_S = 10.0
SCRAPE_TIMEOUT = httpx.Timeout(SCRAPE_TIMEOUT_S)

NEAR_ZERO_HIT_RATE = 0.02  # below this a prefix cache is "not hitting"
SHARED_PREFIX_RATIO = 0.10  # a plan whose prompts share at least this much has shared prefixes


def parse_metrics(text: str) -> MetricSamples:
    """Samples by sample name (``vllm:generation_tokens_total``, ...).

    Raises ReplayError when the text is not Prometheus exposition format.
    """
    samples: MetricSamples = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append(sample)
    except ValueError as exc:
        raise ReplayError(f"/metrics is not Prometheus text: {exc}") from exc
    return samples


def _total(samples: MetricSamples, *names: str) -> float | None:
    for name in names:
        if name in samples:
            return sum(sample.value for sample in samples[name])
    return None


def _peak(samples: MetricSamples, *names: str) -> float | None:
    for name in names:
        if name in samples:
            return max(sample.value for sample in samples[name])
    return None


def _delta(before: MetricSamples, after: MetricSamples, *names: str) -> int | None:
    start, end = _total(before, *names), _total(after, *names)
    if end is None:
        return None
    return round(end - (start or 0.0))


def _by_position(samples: MetricSamples) -> dict[int, float]:
    """Accepted tokens per draft position, summed over engines."""
    totals: dict[int, float] = {}
    for sample in samples.get(SPEC_ACCEPTED_PER_POS, []):
        position = _int_label(sample.labels, "position")
        if position is not None:
            totals[position] = totals.get(position, 0.0) + sample.value
    return totals


def acceptance_per_position(
    before: MetricSamples, after: MetricSamples, drafts: int | None
) -> tuple[float, ...] | None:
    """Accepted at each draft position / drafts over the replay (None: not exported)."""
    start, end = _by_position(before), _by_position(after)
    if not end or not drafts:
        return None
    return tuple((end.get(i, 0.0) - start.get(i, 0.0)) / drafts for i in range(max(end) + 1))


def _ratio(part: int | None, whole: int | None) -> float | None:
    return part / whole if part is not None and whole else None


def _max_over(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return max(present) if present else None


def _cache_config(samples: MetricSamples) -> dict[str, str]:
    found = samples.get(CACHE_CONFIG)
    return dict(found[0].labels) if found else {}


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        return int(float(labels[name]))
    except (KeyError, ValueError):
        return None


def _flag_label(labels: dict[str, str], name: str) -> bool | None:
    value = labels.get(name)
    return None if value is None else value == "True"


def kv_cache_tokens(samples: MetricSamples) -> int | None:
    """KV pool size in tokens from cache_config_info (or blocks x block size)."""
    labels = _cache_config(samples)
    tokens = _int_label(labels, "kv_cache_size_tokens")
    if tokens is not None:
        return tokens
    blocks, block_size = _int_label(labels, "num_gpu_blocks"), _int_label(labels, "block_size")
    return blocks * block_size if blocks is not None and block_size is not None else None


def prefix_caching_enabled(samples: MetricSamples) -> bool | None:
    """What cache_config_info says about --enable-prefix-caching (None if absent)."""
    return _flag_label(_cache_config(samples), "enable_prefix_caching")


def gauge_lines(text: str) -> str:
    """Only the lines the peaks need: a mid-run scrape kept small."""
    return "\n".join(line for line in text.splitlines() if line.startswith(PEAK_GAUGES))


def server_stats_between(before: str, after: str, samples: Sequence[str] = ()) -> ServerStats:
    """ServerStats from the scrape before, the scrape after and any scrapes between."""
    start, end = parse_metrics(before), parse_metrics(after)
    every = [start, *(parse_metrics(text) for text in samples), end]
    prefix_queries = _delta(start, end, *PREFIX_QUERIES)
    prefix_hits = _delta(start, end, *PREFIX_HITS)
    external_queries = _delta(start, end, EXTERNAL_QUERIES)
    external_hits = _delta(start, end, EXTERNAL_HITS)
    drafts = _delta(start, end, SPEC_DRAFTS)
    draft_tokens = _delta(start, end, SPEC_DRAFT_TOKENS)
    accepted = _delta(start, end, SPEC_ACCEPTED)
    running = _max_over(_total(s, RUNNING) for s in every)
    waiting = _max_over(_total(s, WAITING) for s in every)
    labels = _cache_config(end) or _cache_config(start)
    return ServerStats(
        prompt_tokens=_delta(start, end, PROMPT_TOKENS),
        generation_tokens=_delta(start, end, GENERATION_TOKENS),
        prefix_cache_queries=prefix_queries,
        prefix_cache_hits=prefix_hits,
        prefix_cache_hit_rate=_ratio(prefix_hits, prefix_queries),
        external_prefix_cache_queries=external_queries,
        external_prefix_cache_hits=external_hits,
        external_prefix_cache_hit_rate=_ratio(external_hits, external_queries),
        preemptions=_delta(start, end, PREEMPTIONS),
        peak_kv_cache_usage=_max_over(_peak(s, *KV_USAGE) for s in every),
        peak_running=round(running) if running is not None else None,
        peak_waiting=round(waiting) if waiting is not None else None,
        spec_decode_drafts=drafts,
        spec_decode_draft_tokens=draft_tokens,
        spec_decode_accepted_tokens=accepted,
        spec_decode_acceptance_rate=_ratio(accepted, draft_tokens),
        spec_decode_mean_acceptance_length=(
            1 + accepted / drafts if accepted is not None and drafts else None
        ),
        spec_decode_acceptance_per_position=acceptance_per_position(start, end, drafts),
        kv_cache_tokens=kv_cache_tokens(end) or kv_cache_tokens(start),
        block_size=_int_label(labels, "block_size"),
        prefix_caching_enabled=_flag_label(labels, "enable_prefix_caching"),
        scrapes=len(every),
    )


async def scrape(client: httpx.AsyncClient, url: str) -> str:
    """GET ``url``/metrics as text, within ``SCRAPE_TIMEOUT_S``.

    Raises ServerNotAnswering when no answer came in time, ReplayError when it
    cannot be read otherwise.
    """
    target = f"{url.rstrip('/')}/metrics"
    try:
        response = await client.get(target, timeout=SCRAPE_TIMEOUT)
        response.raise_for_status()
    except httpx.TimeoutException as exc:
        raise ServerNotAnswering(
            f"{target} did not answer within {SCRAPE_TIMEOUT_S:g} s ({type(exc).__name__})"
        ) from exc
    except httpx.HTTPError as exc:
        raise ReplayError(f"cannot scrape {target}: {exc}") from exc
    return response.text


def prefix_cache_shares(stats: ServerStats) -> tuple[float, float | None] | None:
    """The shares of prompt tokens the GPU prefix cache and the external tier (LMCache)
    served, over the same tokens, so they add up (None: no prefix-cache figures).

    vLLM's external hit rate is over the tokens the GPU cache missed, not over every
    prompt token: 78% from the GPU and an external rate of 43% is 78% + 9%, not 121%.
    """
    gpu = stats.prefix_cache_hit_rate
    if gpu is None:
        return None
    queries, external_hits = stats.prefix_cache_queries, stats.external_prefix_cache_hits
    if queries and external_hits is not None:
        return gpu, external_hits / queries
    rate = stats.external_prefix_cache_hit_rate
    return gpu, None if rate is None else rate * (1 - gpu)


def explain_prefix_cache(
    stats: ServerStats,
    *,
    plan_hit_ratio: float | None,
    prefix_caching_enabled: bool | None,
    kv_cache_tokens: int | None,
    working_set_tokens: int | None,
) -> str | None:
    """Why the prefix cache hit rate is near 0 on a workload that shares prefixes.

    ``plan_hit_ratio`` is the share of prompt tokens the workload itself could
    reuse (an ideal, unbounded cache); ``working_set_tokens`` the tokens that
    must stay cached at once for those hits. None when there is nothing to
    explain (hits as expected, nothing measured, or no shared prefixes to hit).
    A server with prefix caching off counts no queries, so its rate is None.
    """
    rate = stats.prefix_cache_hit_rate
    if prefix_caching_enabled is None:
        prefix_caching_enabled = stats.prefix_caching_enabled
    if rate is None and prefix_caching_enabled is not False:
        return None
    if rate is not None and rate >= NEAR_ZERO_HIT_RATE:
        return None
    if plan_hit_ratio is not None and plan_hit_ratio < SHARED_PREFIX_RATIO:
        return None
    expected = f" (the workload could reuse {plan_hit_ratio:.0%})" if plan_hit_ratio else ""
    head = f"Prefix cache hit rate was {rate or 0.0:.1%}{expected}: "
    if prefix_caching_enabled is False:
        return head + (
            "prefix caching is off on this server; start it with --enable-prefix-caching "
            "(Qwen3.5-family hybrid models need it given explicitly)."
        )
    pool = kv_cache_tokens if kv_cache_tokens is not None else stats.kv_cache_tokens
    if pool is not None and working_set_tokens is not None and working_set_tokens > pool:
        return head + (
            f"the KV cache holds {pool:,} tokens but the workload's working set is "
            f"{working_set_tokens:,} tokens, so shared prefixes are evicted before they are "
            "reused; raise --kv-cache-memory-bytes, use fp8 KV, lower --max-num-seqs, "
            "or offload prefixes (LMCache)."
        )
    block = f" ({stats.block_size} tokens)" if stats.block_size else ""
    return head + (
        f"the prompts differ within their first KV block{block}, so no whole block is "
        "shared (a timestamp, id or salt at the start of the prompt breaks every prefix); "
        "put the varying text after the shared part."
    )
