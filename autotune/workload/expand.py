"""Expand a workload file into a WorkloadPlan of concrete, replayable requests.

Delta turns reuse their parent's Message objects, and blocks-mode prompts
reuse cached runs of full blocks, so memory grows with the new content of a
workload, not with the sum of its prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.errors import WorkloadError
from autotune.workload.io import Workload, read_workload
from autotune.workload.plan import Message, PlannedRequest, WorkloadPlan
from autotune.workload.schema import (
    MAX_TOKENS,
    BlocksInput,
    DeltaInput,
    FullInput,
    Part,
    RequestRecord,
    SynthPart,
    TextPart,
)
from autotune.workload.synth import Synthesizer
from autotune.workload.tokenizer import Tokenizer, WordTokenizer


def load_plan(
    path: Path, *, tokenizer: Tokenizer | None = None, skip_invalid: bool = False
) -> WorkloadPlan:
    """Read ``path`` and expand it. Raises WorkloadError("FILE:LINE: field: message")."""
    workload = read_workload(path, skip_invalid=skip_invalid)
    return expand(workload, tokenizer=tokenizer, name=path.stem)


def expand(
    workload: Workload, *, tokenizer: Tokenizer | None = None, name: str | None = None
) -> WorkloadPlan:
    """Expand a parsed workload (``WordTokenizer`` when ``tokenizer`` is None)."""
    expander = _Expander(workload, tokenizer or WordTokenizer())
    planned = [expander.request(record) for record in workload.requests]
    planned.sort(key=lambda request: request.arrival_s)  # stable: file order breaks ties
    header = workload.header
    return WorkloadPlan(
        name=name or header.name or "workload",
        requests=tuple(planned),
        token_space=expander.synth.tokenizer.name,
        digest=workload.digest,
        metadata={
            "format_version": header.version,
            "recorded_token_space": header.token_space,
            "block_size": header.block_size,
            "source": dict(header.source),
            "skipped_lines": len(workload.skipped),
        },
    )


@dataclass(frozen=True, slots=True)
class _Built:
    system: str | None
    system_tokens: int
    messages: tuple[Message, ...]
    message_tokens: tuple[int, ...]
    response: Message
    arrival_s: float


@dataclass(frozen=True, slots=True)
class _Segment:
    message: Message
    tokens: int


class _Expander:
    def __init__(self, workload: Workload, tokenizer: Tokenizer) -> None:
        header = workload.header
        self.workload = workload
        self.header = header
        self.synth = Synthesizer(tokenizer, seed=header.seed, block_size=header.block_size)
        self.built: dict[str, _Built] = {}
        self.prefix_text: dict[str, tuple[str, int]] = {}
        self.segments: dict[tuple[str, str, tuple[int, ...]], _Segment] = {}
        self.segment_lengths: dict[tuple[str, int], set[int]] = {}

    def where(self, record: RequestRecord) -> str:
        return self.workload.where(record.id)

    def scope(self, record: RequestRecord, part_scope: str | None) -> str:
        scope = part_scope or self.header.hash_scope
        if scope == "global" or record.session is None:
            return "global"
        return f"session:{record.session}"

    def parts(self, record: RequestRecord, parts: list[Part], key: str) -> tuple[str, int]:
        """Text and token count of a list of parts. Synthetic parts concatenate exactly;
        with literal text, parts are joined by newlines and the result is counted."""
        texts: list[str] = []
        tokens = 0
        literal = False
        for index, part in enumerate(parts):
            if isinstance(part, TextPart):
                texts.append(part.text)
                literal = True
            else:
                texts.append(self.synth_part(record, part, f"{key}:{index}"))
                tokens += part.tokens
        if not literal:
            return self.synth.join(texts), tokens
        text = "\n".join(texts)
        return text, self.synth.count(text)

    def system_start(self, record: RequestRecord) -> tuple[list[str], list[int]]:
        """The system prompt's first pieces and their tokens: the shared prefix, if any."""
        if record.prefix is None:
            return [], []
        text, tokens = self.prefix(record)
        return [text], [tokens]

    def system(self, texts: list[str], counts: list[int]) -> tuple[str | None, int]:
        """The system prompt from its pieces (prefix, then the request's own)."""
        if len(texts) < 2:
            return (texts[0], counts[0]) if texts else (None, 0)
        text = "\n".join(texts)
        return text, self.synth.count(text)

    def synth_part(self, record: RequestRecord, part: SynthPart, key: str) -> str:
        if part.hash_ids is None:
            return self.synth.text(key, part.tokens)
        try:
            return self.synth.blocks_text(
                self.scope(record, part.scope), part.hash_ids, part.tokens, key
            )
        except WorkloadError as exc:
            raise WorkloadError(f"{self.where(record)}: {exc}") from exc

    def prefix(self, record: RequestRecord) -> tuple[str, int]:
        prefix_id = record.prefix
        assert prefix_id is not None  # checked by the caller
        cached = self.prefix_text.get(prefix_id)
        if cached is None:
            parts = self.workload.prefixes[prefix_id].system
            cached = self.parts(record, parts, f"prefix:{prefix_id}")
            self.prefix_text[prefix_id] = cached
        return cached

    def request(self, record: RequestRecord) -> PlannedRequest:
        if isinstance(record.input, DeltaInput):
            system, system_tokens, messages, counts = self.delta(record, record.input)
        elif isinstance(record.input, FullInput):
            system, system_tokens, messages, counts = self.full(record, record.input)
        else:
            system, system_tokens, messages, counts = self.blocks(record, record.input)
        deps = tuple(record.dependencies())
        if record.t_s is not None:
            arrival_s = record.t_s
        else:
            arrival_s = max((self.built[dep].arrival_s for dep in deps), default=0.0)
            arrival_s += record.gap_s
        output = record.output
        prompt_tokens = system_tokens + sum(counts)
        if prompt_tokens + output.tokens > MAX_TOKENS:  # a delta chain's history adds up
            field = "input" if prompt_tokens > MAX_TOKENS else "output.tokens"
            raise WorkloadError(
                f"{self.where(record)}: {field}: the context, {prompt_tokens:,} prompt and "
                f"{output.tokens:,} output tokens, is past the bound of {MAX_TOKENS:,} (the "
                "longest context any model takes)"
            )
        response_text = output.text
        if response_text is None:
            response_text = self.synth.text(f"out:{record.id}", output.tokens)
        self.built[record.id] = _Built(
            system, system_tokens, messages, counts, Message("assistant", response_text), arrival_s
        )
        return PlannedRequest(
            id=record.id,
            session=record.session,
            thread=record.thread,
            after=deps,
            gap_s=record.gap_s,
            arrival_s=arrival_s,
            endpoint=record.endpoint or self.header.endpoint,
            system=system,
            messages=messages,
            prompt_tokens=prompt_tokens,
            output_tokens=output.tokens,
            exact_output=output.exact,
        )

    def delta(
        self, record: RequestRecord, spec: DeltaInput
    ) -> tuple[str | None, int, tuple[Message, ...], tuple[int, ...]]:
        assert record.parent is not None  # the schema requires it
        parent = self.built[record.parent]
        messages = (*parent.messages, parent.response)
        counts = (*parent.message_tokens, self.synth.count(parent.response.text))
        if spec.keep_messages is not None:
            if spec.keep_messages > len(messages):
                raise WorkloadError(
                    f"{self.where(record)}: input.keep_messages: must be <= the parent's "
                    f"{len(messages)} messages and response, but got {spec.keep_messages}"
                )
            messages, counts = messages[: spec.keep_messages], counts[: spec.keep_messages]
        new_messages: list[Message] = []
        new_counts: list[int] = []
        for index, wire in enumerate(spec.append):
            text, tokens = self.parts(record, wire.parts(), f"{record.id}:m{index}")
            new_messages.append(Message(wire.role, text))
            new_counts.append(tokens)
        return (
            parent.system,
            parent.system_tokens,
            messages + tuple(new_messages),
            counts + tuple(new_counts),
        )

    def full(
        self, record: RequestRecord, spec: FullInput
    ) -> tuple[str | None, int, tuple[Message, ...], tuple[int, ...]]:
        system_texts, system_counts = self.system_start(record)
        if spec.system:
            text, tokens = self.parts(record, spec.system, f"{record.id}:sys")
            system_texts.append(text)
            system_counts.append(tokens)
        messages: list[Message] = []
        counts: list[int] = []
        for index, wire in enumerate(spec.messages):
            text, tokens = self.parts(record, wire.parts(), f"{record.id}:m{index}")
            messages.append(Message(wire.role, text))
            counts.append(tokens)
        system, system_tokens = self.system(system_texts, system_counts)
        return system, system_tokens, tuple(messages), tuple(counts)

    def blocks(
        self, record: RequestRecord, spec: BlocksInput
    ) -> tuple[str | None, int, tuple[Message, ...], tuple[int, ...]]:
        size = self.header.block_size
        ids = spec.hash_ids
        if spec.tokens <= size * (len(ids) - 1):
            raise WorkloadError(
                f"{self.where(record)}: input.tokens: {len(ids)} hash ids of {size} tokens "
                f"need more than {size * (len(ids) - 1)} tokens, but got {spec.tokens}"
            )
        full_blocks = min(len(ids), spec.tokens // size)
        if spec.system_blocks > full_blocks or spec.system_blocks * size >= spec.tokens:
            raise WorkloadError(
                f"{self.where(record)}: input.system_blocks: must leave user content and "
                f"cover only full blocks (<= {full_blocks}), but got {spec.system_blocks}"
            )
        scope = self.scope(record, None)
        system_texts, system_counts = self.system_start(record)
        if spec.system_blocks:
            segment = self.segment(scope, tuple(ids[: spec.system_blocks]), "system")
            system_texts.append(segment.message.text)
            system_counts.append(segment.tokens)
        messages: list[Message] = []
        counts: list[int] = []
        pos = spec.system_blocks
        while pos < full_blocks:
            segment, pos = self.longest_segment(scope, ids, pos, full_blocks)
            messages.append(segment.message)
            counts.append(segment.tokens)
        tail_tokens = spec.tokens - full_blocks * size
        if tail_tokens:
            tail_ids = ids[full_blocks:]
            text = self.synth.blocks_text(scope, tail_ids, tail_tokens, f"{record.id}:tail")
            messages.append(Message("user", text))
            counts.append(tail_tokens)
        system, system_tokens = self.system(system_texts, system_counts)
        return system, system_tokens, tuple(messages), tuple(counts)

    def segment(self, scope: str, ids: tuple[int, ...], role: str) -> _Segment:
        """The cached message of a run of full blocks (created on first use)."""
        key = (scope, role, ids)
        segment = self.segments.get(key)
        if segment is None:
            words: list[str] = []
            for hash_id in ids:
                words.extend(self.synth.block_words(scope, hash_id, self.header.block_size))
            segment = _Segment(Message(role, self.synth.join(words)), len(words))
            self.segments[key] = segment
            if role == "user":
                self.segment_lengths.setdefault((scope, ids[0]), set()).add(len(ids))
        return segment

    def longest_segment(
        self, scope: str, ids: list[int], pos: int, end: int
    ) -> tuple[_Segment, int]:
        """Reuse the longest cached run starting at ``pos``, else cache ``ids[pos:end]``."""
        for length in sorted(self.segment_lengths.get((scope, ids[pos]), ()), reverse=True):
            if pos + length <= end:
                segment = self.segments.get((scope, "user", tuple(ids[pos : pos + length])))
                if segment is not None:
                    return segment, pos + length
        return self.segment(scope, tuple(ids[pos:end]), "user"), end
