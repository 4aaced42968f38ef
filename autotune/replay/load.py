"""LoadSpec: how a workload is replayed (load mode, pacing, budget, windows)."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from autotune.replay.records import RequestRecord

LoadMode = Literal["sessions", "concurrency", "trace"]


class LoadSpec(BaseModel):
    """How to drive the server with a WorkloadPlan.

    - ``concurrency``: closed loop, ``concurrency`` requests in flight, requests
      taken in plan order (session structure ignored, prompts as planned).
    - ``sessions``: each session's requests in order, each sent ``gap_s`` after
      its ``after`` dependencies finish; ``concurrency`` sessions at once;
      subagent threads run beside their parent.
    - ``trace``: open loop, each request sent at its recorded ``arrival_s``; with
      ``max_in_flight``, an arrival that finds that many requests in flight waits for
      one to end (``vllm bench serve --request-rate R --max-concurrency N``).

    Recorded gaps and timestamps are divided by ``timing_scale`` (2.0 = twice
    as fast as recorded) and gaps are capped at ``max_gap_s``. All durations
    here are modelled seconds.
    """

    model_config = ConfigDict(frozen=True)

    mode: LoadMode = "sessions"
    concurrency: int = Field(default=8, ge=1)
    timing_scale: float = Field(default=1.0, gt=0)
    max_gap_s: float | None = Field(default=60.0, ge=0)
    duration_s: float | None = Field(default=None, gt=0)  # stop sending after this
    max_requests: int | None = Field(default=None, ge=1)  # stop sending after this many
    max_in_flight: int | None = Field(default=None, ge=1)  # trace: cap on requests in flight
    recycle_sessions: bool = False  # sessions: start again with fresh salts to fill duration
    warmup_requests: int = Field(default=0, ge=0)  # first N completions excluded from stats
    saturation_stop: bool = True  # stop early when the waiting queue grows without bound
    # One request's whole limit, modelled seconds: the OpenAI and Anthropic SDKs' default.
    request_timeout_s: float = Field(default=600.0, gt=0)


class RequestSlo(BaseModel):
    """Per-request thresholds for goodput (a request counts if it meets all given)."""

    model_config = ConfigDict(frozen=True)

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


class ReplayObserver(Protocol):
    """Progress hooks; rich lives at the edge, the runner only calls these."""

    def on_request_done(self, record: RequestRecord, done: int, total: int | None) -> None: ...
