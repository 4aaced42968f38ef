"""Cut a workload to what a card can hold: fewer sessions, shorter contexts, a time window.

Dropping a request also drops the requests that build on it (its delta
children and the rest of its thread), and removes it from others' ``after``
lists (a join on a dropped subagent simply no longer waits).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from autotune.workload.io import Workload
from autotune.workload.schema import (
    BlocksInput,
    DeltaInput,
    Part,
    RequestRecord,
    SynthPart,
    WireMessage,
)
from autotune.workload.tokenizer import Tokenizer, WordTokenizer


@dataclass
class SliceReport:
    """Requests kept and dropped (by reason); of the input, the longest request (id,
    prompt + output tokens) and the one the smallest --max-context keeps (id, that value)."""

    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    sessions_kept: int = 0
    sessions_dropped: int = 0
    longest: tuple[str, int] | None = None
    first_kept: tuple[str, int] | None = None

    def nothing_kept(self) -> str:
        """Why a slice kept no request, and what would keep one."""
        why = ", ".join(f"{count} x {reason}" for reason, count in self.dropped.most_common())
        text = f"the slice keeps no request ({why or 'the workload has none'})"
        if self.longest is not None:
            text += (
                f"; the longest request, {self.longest[0]}, needs {self.longest[1]:,} tokens "
                "(prompt + output)"
            )
        if self.first_kept is not None:
            text += (
                f"; --max-context {self.first_kept[1]} or more keeps {self.first_kept[0]} "
                "and what it builds on"
            )
        return text

    def lines(self) -> list[str]:
        out = [
            f"kept {self.kept} requests in {self.sessions_kept} sessions "
            f"({self.sessions_dropped} sessions dropped)"
        ]
        out.extend(f"  dropped {count} x {reason}" for reason, count in self.dropped.most_common())
        return out


@dataclass(frozen=True, slots=True)
class _Size:
    arrival_s: float
    system_tokens: int
    message_tokens: tuple[int, ...]
    response_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return self.system_tokens + sum(self.message_tokens)


def measure(workload: Workload, tokenizer: Tokenizer) -> dict[str, _Size]:
    """Arrival and prompt size of every request without building text: what ``expand``
    gives with the word tokenizer (counts are additive there), an estimate with others."""

    def parts(items: list[Part]) -> int:
        return sum(p.tokens if isinstance(p, SynthPart) else tokenizer.count(p.text) for p in items)

    def messages(items: list[WireMessage]) -> tuple[int, ...]:
        return tuple(parts(message.parts()) for message in items)

    prefix_tokens = {key: parts(prefix.system) for key, prefix in workload.prefixes.items()}
    sizes: dict[str, _Size] = {}
    for record in workload.requests:
        spec = record.input
        if isinstance(spec, DeltaInput):
            assert record.parent is not None  # the schema requires it
            parent = sizes[record.parent]
            history = (*parent.message_tokens, parent.response_tokens)[: spec.keep_messages]
            system = parent.system_tokens
            counts = history + messages(spec.append)
        else:
            system = prefix_tokens[record.prefix] if record.prefix else 0
            if isinstance(spec, BlocksInput):
                counts = (spec.tokens,)
            else:
                system += parts(spec.system or [])
                counts = messages(spec.messages)
        if record.t_s is not None:
            arrival_s = record.t_s
        else:
            deps = record.dependencies()
            arrival_s = max((sizes[dep].arrival_s for dep in deps), default=0.0) + record.gap_s
        output = record.output
        response = tokenizer.count(output.text) if output.text is not None else output.tokens
        sizes[record.id] = _Size(arrival_s, system, counts, response)
    return sizes


def _drop_reasons(
    workload: Workload,
    sizes: dict[str, _Size],
    sessions: set[str] | None,
    max_context: int | None,
    duration_s: float | None,
) -> dict[str, str]:
    """Why each dropped request is dropped (request id -> reason); ``sessions`` None: all."""
    start_s = min((size.arrival_s for size in sizes.values()), default=0.0)
    reasons: dict[str, str] = {}
    for record in workload.requests:
        size = sizes[record.id]
        if sessions is not None and record.session is not None and record.session not in sessions:
            reasons[record.id] = "session beyond --sessions"
        elif duration_s is not None and size.arrival_s - start_s > duration_s:
            reasons[record.id] = f"arrives after {duration_s:g}s"
        elif record.parent is not None and record.parent in reasons:
            reasons[record.id] = "builds on a dropped request"
        elif record.dependencies() and all(dep in reasons for dep in record.dependencies()):
            reasons[record.id] = "waits only on dropped requests"
        elif max_context is not None and size.prompt_tokens + record.output.tokens > max_context:
            reasons[record.id] = f"prompt + output over {max_context} tokens"
    return reasons


def context_to_keep(workload: Workload, sizes: dict[str, _Size]) -> dict[str, int]:
    """The smallest --max-context that keeps each request: its own prompt + output, and
    what its parent needs (a delta builds on it) or the least any of its ``after`` needs
    (it is dropped only when all of them are)."""
    needs: dict[str, int] = {}
    for record in workload.requests:
        need = sizes[record.id].prompt_tokens + record.output.tokens
        if record.parent is not None:
            need = max(need, needs[record.parent])
        deps = record.dependencies()
        if deps:
            need = max(need, min(needs[dep] for dep in deps))
        needs[record.id] = need
    return needs


def _sessions_by_arrival(
    workload: Workload, sizes: dict[str, _Size], dropped: dict[str, str]
) -> list[str]:
    """Sessions with a request not in ``dropped``, by their first such arrival."""
    kept = [record for record in workload.requests if record.id not in dropped]
    kept.sort(key=lambda record: sizes[record.id].arrival_s)
    return list(dict.fromkeys(r.session for r in kept if r.session is not None))


def slice_workload(
    workload: Workload,
    *,
    sessions: int | None = None,
    max_context: int | None = None,
    duration_s: float | None = None,
    tokenizer: Tokenizer | None = None,
) -> tuple[Workload, SliceReport]:
    """Keep requests whose prompt + output fits ``max_context`` tokens and that arrive
    within ``duration_s`` of the start, then the first ``sessions`` sessions (by first
    arrival) of those that still have a request: filter, then pick."""
    sizes = measure(workload, tokenizer or WordTokenizer())
    all_sessions = {r.session for r in workload.requests if r.session is not None}
    reasons = _drop_reasons(workload, sizes, None, max_context, duration_s)
    if sessions is not None:
        picked = set(_sessions_by_arrival(workload, sizes, reasons)[:sessions])
        reasons = _drop_reasons(workload, sizes, picked, max_context, duration_s)
    report = SliceReport()
    if workload.requests:
        totals = {r.id: sizes[r.id].prompt_tokens + r.output.tokens for r in workload.requests}
        report.longest = max(totals.items(), key=lambda item: item[1])
        if max_context is not None:
            needs = context_to_keep(workload, sizes)
            report.first_kept = min(needs.items(), key=lambda item: item[1])
    kept: list[RequestRecord] = []
    for record in workload.requests:
        if record.id in reasons:
            report.dropped[reasons[record.id]] += 1
            continue
        if record.after is not None and any(dep in reasons for dep in record.after):
            after = [dep for dep in record.after if dep not in reasons]
            default = [record.parent] if record.parent else []
            record = record.model_copy(update={"after": None if after == default else after})
        kept.append(record)
    report.kept = len(kept)
    report.sessions_kept = len({r.session for r in kept if r.session is not None})
    report.sessions_dropped = len(all_sessions) - report.sessions_kept
    used = {record.prefix for record in kept if record.prefix is not None}
    prefixes = {key: value for key, value in workload.prefixes.items() if key in used}
    return Workload(workload.header, prefixes, kept), report
