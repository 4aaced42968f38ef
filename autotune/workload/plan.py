"""WorkloadPlan: a workload expanded into concrete, replayable requests.

The workload file (``schema.py``) is compact: sessions as deltas, synthetic
blocks named by hash ids. ``load_plan`` expands it once into PlannedRequests
whose prompts are concrete text, so the replayer (over HTTP) and the
simulator's in-process predictor (no HTTP) consume exactly the same thing.

Prompts share structure: a turn's ``messages`` tuple reuses the previous
turn's Message objects, so a 100-turn session does not hold 100 copies of its
history.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Literal

Endpoint = Literal["openai.chat", "openai.completions", "anthropic.messages"]


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message with plain-text content (tool calls are rendered as text)."""

    role: str  # "user" | "assistant" | "system"
    text: str


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request, ready to send.

    ``after`` lists request ids that must finish before this one is sent, and
    ``gap_s`` the client-side wait (think / tool time) after the last of them;
    ``arrival_s`` is the recorded arrival offset, used by the open-loop mode.
    """

    id: str
    session: str | None  # None: an independent request
    thread: str  # "main", "sa:<agent>" for a subagent, ...
    after: tuple[str, ...]
    gap_s: float
    arrival_s: float
    endpoint: Endpoint
    system: str | None
    messages: tuple[Message, ...]  # for openai.completions: rendered into one prompt
    prompt_tokens: int  # in the plan's token space (an estimate when not exact)
    output_tokens: int  # target output length
    exact_output: bool = True  # send max_tokens = min_tokens = output_tokens, ignore_eos


@dataclass(frozen=True)
class WorkloadPlan:
    """All requests of a workload, in arrival order."""

    name: str
    requests: tuple[PlannedRequest, ...]
    token_space: str  # tokenizer the counts are exact in, or "words" (the approximation)
    digest: str  # content hash of the workload file: a study refuses another workload
    metadata: dict[str, object] = field(default_factory=dict)

    @functools.cached_property
    def content_digest(self) -> str:
        """A hash of everything a replay of the plan sends and reads (its requests, whole,
        and its metadata), whatever file or tokenizer it came from: what a kept
        prediction of the plan is keyed by."""
        digest = hashlib.sha256(f"{self.name}\0{self.token_space}\0{self.digest}".encode())
        digest.update(json.dumps(self.metadata, sort_keys=True, default=str).encode())
        for request in self.requests:
            fields = {
                f.name: getattr(request, f.name)
                for f in dataclasses.fields(request)
                if f.name != "messages"
            }
            digest.update(json.dumps(fields, sort_keys=True).encode())
            for message in request.messages:
                digest.update(f"\0{message.role}\0{len(message.text)}\0".encode())
                digest.update(message.text.encode())
        return digest.hexdigest()

    @property
    def sessions(self) -> list[str]:
        seen: dict[str, None] = {}
        for request in self.requests:
            if request.session is not None:
                seen.setdefault(request.session, None)
        return list(seen)
