"""Import Weka / kv-cache-tester Claude Code traces (one JSON file per session).

Each trace becomes a session; its requests become blocks-mode requests (the
trace's 64-token hash ids, scoped to the session), subagents become child
threads ``sa:<agent_id>`` that start after the main-thread request that spawned
them and are joined by the next main-thread request when they finished before
it. The first ``(tool_tokens + system_tokens) // 64`` blocks are the Claude
Code tools + system prefix: the tool definitions are shared by every trace
with the same ``tool_tokens``, the system text by traces with the same sizes.
A request whose ids leave the thread's prefix after k blocks uses the prefix's
first k blocks (a prefix record of its own, the same text), so every leading
block the raw ids share stays shared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autotune.errors import WorkloadError
from autotune.workload.importers._report import ImportReport
from autotune.workload.io import Workload
from autotune.workload.plan import Endpoint
from autotune.workload.schema import (
    FORMAT_VERSION,
    BlocksInput,
    Header,
    Output,
    PrefixRecord,
    RequestRecord,
    SynthPart,
)

BLOCK_SIZE = 64
TOOLS_HASH_BASE = 1 << 40  # global hash ids of tool-definition blocks, apart from trace ids
SYSTEM_HASH_BASE = 1 << 48  # global hash ids of a prefix's system-text blocks


@dataclass
class _Thread:
    """State while converting one thread (main or a subagent)."""

    session: str
    name: str
    prefix_id: str | None
    prefix_ids: list[int]
    last_id: str | None = None
    last_end_s: float = 0.0


def trace_files(source: Path) -> list[Path]:
    """``source`` itself, or the ``*.json`` files of a directory (sorted)."""
    if source.is_dir():
        return sorted(p for p in source.glob("*.json") if p.is_file())
    return [source]


def import_weka(
    source: Path, *, endpoint: Endpoint = "openai.chat"
) -> tuple[Workload, ImportReport]:
    """Convert a trace file or a directory of traces. Raises WorkloadError if none is readable."""
    report = ImportReport(str(source))
    prefixes: dict[str, PrefixRecord] = {}
    requests: list[RequestRecord] = []
    for path in trace_files(source):
        try:
            trace = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            report.dropped[f"unreadable trace file ({type(exc).__name__})"] += 1
            continue
        if not isinstance(trace, dict) or not isinstance(trace.get("requests"), list):
            report.dropped["not a trace (no 'requests' list)"] += 1
            continue
        if trace.get("block_size", BLOCK_SIZE) != BLOCK_SIZE:
            report.dropped[f"block_size other than {BLOCK_SIZE}"] += 1
            continue
        report.read["traces"] += 1
        requests.extend(_trace(trace, path.stem, prefixes, report))
    if not requests:
        raise WorkloadError(f"{source}: no readable Weka trace requests")
    header = Header(
        version=FORMAT_VERSION,
        name=source.stem,
        token_space="claude",
        block_size=BLOCK_SIZE,
        hash_scope="session",
        endpoint=endpoint,
        source={"kind": "weka", "path": str(source)},
    )
    return Workload(header, prefixes, requests), report


def _prefix(
    owner: dict[str, Any], first: dict[str, Any], prefixes: dict[str, PrefixRecord]
) -> tuple[str | None, list[int]]:
    """The shared-prefix id and the hash ids it replaces (from the thread's first request)."""
    tool_tokens = int(owner.get("tool_tokens") or 0)
    system_tokens = int(owner.get("system_tokens") or 0)
    full = (tool_tokens + system_tokens) // BLOCK_SIZE
    blocks = min(full, len(first.get("hash_ids") or []) - 1)
    if blocks <= 0:
        return None, []
    prefix_id = f"cc.{tool_tokens}.{system_tokens}"
    if prefix_id not in prefixes:
        parts = _prefix_parts(tool_tokens, system_tokens, full)
        prefixes[prefix_id] = PrefixRecord(id=prefix_id, system=parts)
    return _leading(prefixes, prefix_id, blocks), list(first["hash_ids"][:blocks])


def _prefix_parts(tool_tokens: int, system_tokens: int, blocks: int) -> list[SynthPart]:
    """Tool definitions first (as Anthropic renders them), shared by every trace with the
    same tool_tokens; then the system text, shared by traces with the same sizes. Both
    through global hash ids, so a prefix's first k blocks are text of their own."""
    total = blocks * BLOCK_SIZE
    tools = min(tool_tokens, total)
    parts: list[SynthPart] = []
    if tools:
        ids = [TOOLS_HASH_BASE + tool_tokens * 1_000 + i for i in range(-(-tools // BLOCK_SIZE))]
        parts.append(SynthPart(tokens=tools, hash_ids=ids, scope="global"))
    if total > tools:
        base = SYSTEM_HASH_BASE + (tool_tokens * 100_000 + system_tokens) * 1_000
        count = -(-(total - tools) // BLOCK_SIZE)
        ids = [base + i for i in range(count)]
        parts.append(SynthPart(tokens=total - tools, hash_ids=ids, scope="global"))
    return parts


def _leading(prefixes: dict[str, PrefixRecord], prefix_id: str, blocks: int) -> str:
    """The id of a prefix's first ``blocks`` blocks (the prefix itself when that is all of it):
    the same text, so a request that leaves the prefix part-way still shares its start."""
    full = prefixes[prefix_id]
    if sum(part.tokens for part in full.system if isinstance(part, SynthPart)) <= (
        blocks * BLOCK_SIZE
    ):
        return prefix_id
    cut_id = f"{prefix_id}@{blocks}"
    if cut_id not in prefixes:
        left = blocks * BLOCK_SIZE
        parts: list[SynthPart] = []
        for part in full.system:
            assert isinstance(part, SynthPart) and part.hash_ids is not None  # _prefix_parts
            take = min(part.tokens, left)
            if take:
                ids = part.hash_ids[: -(-take // BLOCK_SIZE)]
                parts.append(part.model_copy(update={"tokens": take, "hash_ids": ids}))
            left -= take
        prefixes[cut_id] = PrefixRecord(id=cut_id, system=parts)
    return cut_id


def _request(
    raw: dict[str, Any], thread: _Thread, request_id: str, t_s: float, after: list[str],
    prefixes: dict[str, PrefixRecord], report: ImportReport,
) -> RequestRecord | None:  # fmt: skip
    try:
        hash_ids = [int(h) for h in raw["hash_ids"]]
        tokens = int(raw["in"])
        output = int(raw["out"])
    except (KeyError, TypeError, ValueError):
        report.dropped["request without in/out/hash_ids"] += 1
        return None
    if output < 1:
        report.adjusted["output of 0 tokens replayed as 1"] += 1
        output = 1
    prefix_id = None
    shared = _common_length(hash_ids, thread.prefix_ids)
    shared = min(shared, len(hash_ids) - 1)  # the request keeps at least one block of its own
    if thread.prefix_id and shared > 0:
        prefix_id = (
            thread.prefix_id
            if shared == len(thread.prefix_ids)
            else _leading(prefixes, thread.prefix_id.partition("@")[0], shared)
        )
        hash_ids = hash_ids[shared:]
        tokens -= shared * BLOCK_SIZE
    if not hash_ids or tokens <= BLOCK_SIZE * (len(hash_ids) - 1):
        report.dropped["hash_ids inconsistent with the input length"] += 1
        return None
    think_s = float(raw.get("think_time") or 0.0)
    try:
        return RequestRecord(
            id=request_id,
            session=thread.session,
            thread=thread.name,
            parent=thread.last_id,
            after=after if after != ([thread.last_id] if thread.last_id else []) else None,
            gap_s=max(0.0, think_s),
            t_s=max(0.0, t_s),
            prefix=prefix_id,
            input=BlocksInput(hash_ids=hash_ids, tokens=tokens),
            output=Output(tokens=output),
            input_tokens=int(raw["in"]),
            expect=_expect(raw),
        )
    except ValidationError as exc:
        report.dropped[f"invalid request ({exc.errors()[0]['loc'][0]})"] += 1
        return None


def _common_length(ids: list[int], prefix_ids: list[int]) -> int:
    """How many leading ids ``ids`` shares with ``prefix_ids``."""
    for index, (a, b) in enumerate(zip(ids, prefix_ids, strict=False)):
        if a != b:
            return index
    return min(len(ids), len(prefix_ids))


def _expect(raw: dict[str, Any]) -> dict[str, object] | None:
    keys = ("api_time", "ttft", "stop")
    expect = {key: raw[key] for key in keys if raw.get(key) not in (None, "")}
    return expect or None


def _trace(
    trace: dict[str, Any], name: str, prefixes: dict[str, PrefixRecord], report: ImportReport
) -> list[RequestRecord]:
    session = str(trace.get("id") or name)
    raws = [r for r in trace["requests"] if isinstance(r, dict)]
    mains = [r for r in raws if r.get("type") != "subagent"]
    if not mains:
        report.dropped["trace without main-thread requests"] += 1
        return []
    report.read["sessions"] += 1
    prefix_id, prefix_ids = _prefix(trace, mains[0], prefixes)
    main = _Thread(session, "main", prefix_id, prefix_ids)
    out: list[RequestRecord] = []
    pending_joins: list[tuple[float, str]] = []  # (end time, last request id) of subagents
    counter = 0
    for raw in raws:
        t_s = float(raw.get("t") or 0.0)
        if raw.get("type") == "subagent":
            last = _subagent(raw, session, main, t_s, prefixes, report, out)
            if last is not None:
                pending_joins.append((t_s + float(raw.get("duration_ms") or 0) / 1000, last))
            continue
        report.read["requests"] += 1
        after = [main.last_id] if main.last_id else []
        joined = [rid for end_s, rid in pending_joins if end_s <= t_s + 1.0]
        pending_joins = [(end_s, rid) for end_s, rid in pending_joins if end_s > t_s + 1.0]
        rid = f"{session}.r{counter:04d}"
        request = _request(raw, main, rid, t_s, after + joined, prefixes, report)
        counter += 1
        if request is not None:
            out.append(request)
            main.last_id = request.id
            main.last_end_s = t_s + float(raw.get("api_time") or 0.0)
    return out


def _subagent(
    marker: dict[str, Any], session: str, main: _Thread, start_s: float,
    prefixes: dict[str, PrefixRecord], report: ImportReport, out: list[RequestRecord],
) -> str | None:  # fmt: skip
    raws = [r for r in marker.get("requests") or [] if isinstance(r, dict)]
    if not raws:
        report.dropped["subagent without requests"] += 1
        return None
    report.read["subagents"] += 1
    agent = str(marker.get("agent_id") or f"agent{len(out)}")
    prefix_id, prefix_ids = _prefix(marker, raws[0], prefixes)
    thread = _Thread(session, f"sa:{agent}", prefix_id, prefix_ids)
    for index, raw in enumerate(raws):
        report.read["requests"] += 1
        if thread.last_id is None:
            after = [main.last_id] if main.last_id else []
        else:
            after = [thread.last_id]
        t_s = start_s + float(raw.get("t") or 0.0)
        rid = f"{session}.{agent}.r{index:04d}"
        request = _request(raw, thread, rid, t_s, after, prefixes, report)
        if request is None:
            continue
        if thread.last_id is None:  # spawned: wait from the spawner's end to the start
            gap_s = max(0.0, start_s - main.last_end_s) if main.last_id else 0.0
            request = request.model_copy(update={"gap_s": gap_s})
        out.append(request)
        thread.last_id = request.id
    return thread.last_id
