"""Build a workload from observed LLM calls (recorder, request logs), as deltas where possible.

Calls are grouped into threads by (session, system prompt). A call whose
messages extend a thread's last prompt and the response the client sent back
becomes a ``delta`` turn (``keep_messages`` when it shares only a prefix: a
rewind or compaction); other calls are ``full`` requests referencing a shared
prefix record per distinct system prompt. Calls without a session key are
chained the same way, and a chain of one stays an independent request.

Anonymised, each text becomes synthetic text of the same token count, block
by block: blocks that start alike in two texts (two sessions' system prompts
sharing their first 590 words) get the same hash ids and so the same
synthetic text, and shared prefixes stay shared.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field

from autotune.workload.io import Workload
from autotune.workload.render import RenderedCall
from autotune.workload.schema import (
    DEFAULT_BLOCK_SIZE,
    FORMAT_VERSION,
    DeltaInput,
    FullInput,
    Header,
    Output,
    Part,
    PrefixRecord,
    RequestRecord,
    SynthPart,
    TextPart,
    WireMessage,
)
from autotune.workload.tokenizer import WordTokenizer

BILLING_HEADER_SOURCE_KEY = "billing_header_requests"  # in the header's ``source``
DEFAULT_OUTPUT_TOKENS = 256  # when neither usage nor a response says how long the output was
MAX_TIPS = 64  # branch tips remembered per (session, system prompt)


@dataclass(frozen=True)
class ObservedCall:
    """One call as seen on the wire; times in seconds on any common clock."""

    call: RenderedCall
    session_key: str | None
    start_s: float
    end_s: float | None = None
    output_tokens: int | None = None
    output_text: str | None = None
    expect: dict[str, object] | None = None


@dataclass
class _Entry:
    id: str
    session: str | None
    inferred_session: bool
    thread: str
    call: RenderedCall
    t_s: float
    end_s: float | None
    output_tokens: int
    parent: _Entry | None = None
    keep: int | None = None
    append_from: int = 0  # delta: first message index of the call that is new
    response_text: str | None = None  # what the client sent back as this call's response
    children: int = 0
    gap_s: float = 0.0
    expect: dict[str, object] | None = None


@dataclass
class WorkloadBuilder:
    """Accumulates ObservedCalls; ``workload()`` returns the records built so far."""

    name: str
    source: dict[str, object] = field(default_factory=dict)
    anonymize: bool = False
    entries: list[_Entry] = field(default_factory=list)
    adjusted: dict[str, int] = field(default_factory=dict)
    _tips: dict[tuple[str | None, str | None], list[_Entry]] = field(default_factory=dict)
    _threads: dict[tuple[str | None, str | None], str] = field(default_factory=dict)
    _t0: float | None = None
    _tokenizer: WordTokenizer = field(default_factory=WordTokenizer)
    _anonymized: dict[str, list[Part]] = field(default_factory=dict)  # text -> its parts
    _block_numbers: dict[bytes, int] = field(default_factory=dict)  # chained block hash -> id

    def add(self, observed: ObservedCall) -> str:
        """Record one call; returns its request id."""
        if self._t0 is None:
            self._t0 = observed.start_s
        call = observed.call
        key = (observed.session_key, call.system)
        parent, keep = self._best_parent(self._tips.get(key, []), call.messages)
        session = observed.session_key
        inferred = False
        if session is None:
            session = parent.session if parent else f"auto{len(self.entries):05d}"
            inferred = True
        thread = self._threads.setdefault(key, self._thread_name(observed.session_key))
        entry = _Entry(
            id=f"q{len(self.entries):05d}",
            session=session,
            inferred_session=inferred,
            thread=thread,
            call=call,
            t_s=max(0.0, observed.start_s - self._t0),
            end_s=observed.end_s,
            output_tokens=self._output_tokens(observed),
            expect=observed.expect,
        )
        if parent is not None:
            entry.parent, entry.keep = parent, keep
            history = len(parent.call.messages) + 1
            entry.append_from = keep if keep is not None else history
            if entry.append_from > len(parent.call.messages):
                parent.response_text = call.messages[len(parent.call.messages)][1]
            parent.children += 1
            if parent.end_s is not None:
                entry.gap_s = max(0.0, observed.start_s - parent.end_s)
        tips = self._tips.setdefault(key, [])
        if parent is not None and keep is None and parent in tips:
            tips.remove(parent)
        tips.append(entry)
        del tips[:-MAX_TIPS]
        self.entries.append(entry)
        return entry.id

    def _thread_name(self, session_key: str | None) -> str:
        used = sum(1 for (session, _) in self._threads if session == session_key)
        return "main" if used == 0 else f"t{used}"

    def _output_tokens(self, observed: ObservedCall) -> int:
        if observed.output_tokens and observed.output_tokens > 0:
            return observed.output_tokens
        if observed.output_text:
            return max(1, self._tokenizer.count(observed.output_text))
        reason = "output length unknown: used max_tokens or the default"
        self.adjusted[reason] = self.adjusted.get(reason, 0) + 1
        return min(observed.call.max_tokens or DEFAULT_OUTPUT_TOKENS, DEFAULT_OUTPUT_TOKENS)

    @staticmethod
    def _best_parent(
        tips: list[_Entry], messages: tuple[tuple[str, str], ...]
    ) -> tuple[_Entry | None, int | None]:
        """The tip sharing the longest message prefix with ``messages`` (and what to keep)."""
        best: _Entry | None = None
        best_k = 0
        for tip in tips:
            history = tip.call.messages
            k = 0
            while k < len(messages) and k <= len(history):
                if k == len(history):  # the response position
                    role, text = messages[k]
                    if role != "assistant" or tip.response_text not in (None, text):
                        break
                elif messages[k] != history[k]:
                    break
                k += 1
            if k > best_k and k < len(messages):  # something must be new
                best, best_k = tip, k
        if best is None:
            return None, None
        full_history = len(best.call.messages) + 1
        return best, (None if best_k == full_history else best_k)

    def workload(self) -> Workload:
        prefixes: dict[str, PrefixRecord] = {}
        prefix_ids: dict[str, str] = {}
        requests: list[RequestRecord] = []
        for entry in self.entries:
            session = entry.session
            if entry.inferred_session and entry.parent is None and entry.children == 0:
                session = None
            prefix = None
            if entry.parent is None:
                spec: DeltaInput | FullInput = FullInput(messages=self._wire(entry.call.messages))
                if entry.call.system is not None:
                    prefix = self._prefix(entry.call.system, prefixes, prefix_ids)
            else:
                appended = entry.call.messages[entry.append_from :]
                spec = DeltaInput(append=self._wire(appended), keep_messages=entry.keep)
            text = None if self.anonymize else entry.response_text
            requests.append(
                RequestRecord(
                    id=entry.id,
                    session=session,
                    thread=entry.thread,
                    parent=entry.parent.id if entry.parent else None,
                    gap_s=round(entry.gap_s, 3),
                    t_s=round(entry.t_s, 3),
                    endpoint=entry.call.endpoint,
                    prefix=prefix,
                    input=spec,
                    output=Output(tokens=entry.output_tokens, text=text),
                    expect=entry.expect,
                )
            )
        header = Header(
            version=FORMAT_VERSION,
            name=self.name,
            token_space="words",
            block_size=DEFAULT_BLOCK_SIZE,  # anonymised text: tokens per hash id
            endpoint=self.entries[0].call.endpoint if self.entries else "openai.chat",
            source={**self.source, "anonymized": self.anonymize, **self._billing_source()},
        )
        return Workload(header, prefixes, requests)

    def _billing_source(self) -> dict[str, object]:
        """``billing_header_requests``: calls that carried Claude Code's billing block."""
        carried = sum(1 for entry in self.entries if entry.call.billing_header)
        return {BILLING_HEADER_SOURCE_KEY: carried} if carried else {}

    def _content(self, text: str) -> list[Part]:
        if not self.anonymize:
            return [TextPart(text=text)]
        parts = self._anonymized.get(text)
        if parts is None:
            ids = self._tokenizer.encode(text)
            parts = [TextPart(text="")]
            if ids:
                hash_ids = self._block_ids(ids)
                parts = [SynthPart(tokens=len(ids), hash_ids=hash_ids, scope="global")]
            self._anonymized[text] = parts
        return parts

    def _block_ids(self, ids: list[int]) -> list[int]:
        """One id per ``DEFAULT_BLOCK_SIZE``-token block, chained over the blocks before it
        (as vLLM hashes its KV blocks): texts that start alike share their leading ids, and
        so their synthetic text. Ids are numbered in order of first sight; no text leaks."""
        chain = b""
        out = []
        for start in range(0, len(ids), DEFAULT_BLOCK_SIZE):
            block = array("q", ids[start : start + DEFAULT_BLOCK_SIZE]).tobytes()
            chain = hashlib.blake2b(chain + block, digest_size=16).digest()
            out.append(self._block_numbers.setdefault(chain, len(self._block_numbers)))
        return out

    def _wire(self, messages: tuple[tuple[str, str], ...]) -> list[WireMessage]:
        return [
            WireMessage(
                role=role,  # type: ignore[arg-type]  # render._role yields only valid roles
                content=self._content(text) if self.anonymize else text,
            )
            for role, text in messages
        ]

    def _prefix(
        self, system: str, prefixes: dict[str, PrefixRecord], prefix_ids: dict[str, str]
    ) -> str:
        digest = hashlib.sha256(system.encode()).hexdigest()
        prefix_id = prefix_ids.get(digest)
        if prefix_id is None:
            prefix_id = f"p{len(prefix_ids):03d}"
            prefix_ids[digest] = prefix_id
            prefixes[prefix_id] = PrefixRecord(id=prefix_id, system=self._content(system))
        return prefix_id
