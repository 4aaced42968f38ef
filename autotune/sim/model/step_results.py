"""What the scheduler core reports: per-step outputs, decode runs, counters and gauges."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TokenOutput:
    """Tokens one request produced in one step."""

    request_id: str
    new_tokens: int
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int  # prefix-cache hits (local + external), known once scheduled


@dataclass
class StepResult:
    """One engine iteration: when it started, how long it took, what it produced."""

    start_s: float
    duration_s: float
    outputs: list[TokenOutput]
    oom: str | None = None  # vLLM's OOM text: this step's transients exceeded the headroom
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0


@dataclass
class DecodeRun:
    """Several pure-decode steps run at once: one chunk per step for every listed request."""

    start_s: float
    step_end_s: np.ndarray  # clock at the end of each step
    request_ids: list[str]
    tokens: list[int]  # tokens each request got over the run (steps x 1 without drafts)
    # Requests waited through it for room in the pool (a seat was free): steps that
    # step() ran one by one before decode runs covered them.
    waited: bool = False

    @property
    def num_steps(self) -> int:
        return len(self.step_end_s)


@dataclass
class EngineCounters:
    """Cumulative counters and current gauges, as vLLM's /metrics exposes them."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    num_preemptions: int = 0
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_accepted_per_pos: list[int] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # 0..1
