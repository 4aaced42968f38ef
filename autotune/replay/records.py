"""What one replayed request produced, and what a whole replay adds up to.

Every time here is in *modelled* seconds: when the server runs ``time_scale``
times faster than the hardware it models (the simulator), the runner multiplies
measured durations by the scale before they land in a record.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class RequestError(StrEnum):
    """Client-side classification of a request that did not complete."""

    HTTP_4XX = "http-4xx"
    HTTP_5XX = "http-5xx"
    TIMEOUT = "timeout"
    CONNECT = "connect"  # could not connect / connection reset before a response
    CUT_STREAM = "cut-stream"  # the stream ended without its final event
    MALFORMED = "malformed"  # SSE / JSON that cannot be parsed
    LINE_TOO_LONG = "line-too-long"  # an SSE line or error body past the client's bound


class RequestRecord(BaseModel):
    """One request as the client saw it. Definitions follow `vllm bench serve`."""

    model_config = ConfigDict(frozen=True)

    id: str
    session: str | None = None
    endpoint: str
    send_s: float  # send time, from the start of the replay
    ttft_s: float | None = None  # send -> first chunk with content
    e2e_s: float | None = None  # send -> last chunk
    output_tokens: int = 0  # from usage; chunk count as fallback
    prompt_tokens: int | None = None  # from usage
    cached_tokens: int | None = None  # when the server reports it
    chunks: int = 0
    itl_mean_s: float | None = None  # mean gap between successive content chunks
    itl_max_s: float | None = None
    finish_reason: str | None = None
    error: RequestError | None = None
    http_status: int | None = None
    error_detail: str | None = None  # first line of the error body or exception
    in_window: bool = True  # inside the measurement window (False: warm-up)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """(e2e - ttft) / (output_tokens - 1), as vLLM defines it; None for 1 token."""
        if self.e2e_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class Percentiles(BaseModel):
    """Mean and percentiles of one latency, in seconds."""

    model_config = ConfigDict(frozen=True)

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


class TokenCheck(BaseModel):
    """The first requests of a replay, planned (text + template) vs served prompt tokens."""

    model_config = ConfigDict(frozen=True)

    token_space: str  # the tokenizer the plan's counts are in
    checked: int
    mismatched: int
    planned_tokens: int  # text + template, summed over the checked requests
    served_tokens: int  # the server's usage.prompt_tokens, summed
    template_tokens: int  # of planned_tokens, what the chat template adds
    worst_error: float  # largest |served - planned| / planned of one request
    message: str  # one plain sentence

    @property
    def ok(self) -> bool:
        return self.mismatched == 0


class ReplayStats(BaseModel):
    """The summary of one replay (the measurement window only)."""

    model_config = ConfigDict(frozen=True)

    duration_s: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput_rps: float
    output_throughput_tok_s: float
    total_token_throughput_tok_s: float
    goodput_rps: float | None = None  # requests/s meeting every SLO (when SLOs are given)
    ttft: Percentiles = Field(default_factory=Percentiles)
    tpot: Percentiles = Field(default_factory=Percentiles)
    itl: Percentiles = Field(default_factory=Percentiles)
    e2e: Percentiles = Field(default_factory=Percentiles)
    max_concurrent_requests: int = 0
    errors_by_class: dict[str, int] = Field(default_factory=dict)
    stopped_early: str | None = None  # why the run stopped before its budget, if it did
    prompt_tokens_check: TokenCheck | None = None  # first requests: planned vs served prompts
    # Prompt tokens the server took from its prefix cache (GPU or connector) at each
    # request's first prefill, summed from per-request usage (None: the server did not
    # say). Unlike the server's prefix-cache counters, a re-prefill after preemption adds
    # nothing here, so this never exceeds what an infinite cache could reach.
    cached_input_tokens: int | None = None

    @property
    def first_prefill_hit_rate(self) -> float | None:
        """``cached_input_tokens`` over the completed requests' prompt tokens."""
        if self.cached_input_tokens is None or not self.total_input_tokens:
            return None
        return self.cached_input_tokens / self.total_input_tokens

    @property
    def error_rate(self) -> float:
        total = self.completed + self.failed
        return self.failed / total if total else 0.0
