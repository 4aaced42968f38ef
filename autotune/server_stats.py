"""ServerStats: what the server's own /metrics said about one replay."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ServerStats(BaseModel):
    """Deltas and peaks of vLLM's Prometheus metrics over one replay.

    Rates are fractions in [0, 1]; None when the server does not expose the metric.
    """

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int | None = None  # vllm:prompt_tokens delta
    generation_tokens: int | None = None  # vllm:generation_tokens delta
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    prefix_cache_hit_rate: float | None = None
    external_prefix_cache_queries: int | None = None
    external_prefix_cache_hits: int | None = None
    external_prefix_cache_hit_rate: float | None = None  # LMCache / connector hits
    preemptions: int | None = None
    peak_kv_cache_usage: float | None = None  # vllm:kv_cache_usage_perc (0..1)
    peak_running: int | None = None
    peak_waiting: int | None = None
    spec_decode_drafts: int | None = None
    spec_decode_draft_tokens: int | None = None
    spec_decode_accepted_tokens: int | None = None
    spec_decode_acceptance_rate: float | None = None  # accepted / draft tokens
    spec_decode_mean_acceptance_length: float | None = None  # 1 + accepted / drafts
    kv_cache_tokens: int | None = None  # from vllm:cache_config_info labels
    block_size: int | None = None  # from vllm:cache_config_info labels
    prefix_caching_enabled: bool | None = None  # from vllm:cache_config_info labels
    scrapes: int = 0
