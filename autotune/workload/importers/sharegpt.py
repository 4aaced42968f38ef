"""Import ShareGPT: a JSON array of ``{"id", "conversations": [{"from", "value"}]}``.

Each conversation becomes a session: one request per human turn, the
following assistant turn as its output (its text is the recorded history of
the next turn, its word count the exact output length).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.errors import WorkloadError
from autotune.workload.builder import ObservedCall, WorkloadBuilder
from autotune.workload.importers._report import ImportReport
from autotune.workload.io import Workload
from autotune.workload.plan import Endpoint
from autotune.workload.render import RenderedCall
from autotune.workload.tokenizer import WordTokenizer

_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}


def _turns(conversation: Any, report: ImportReport) -> list[tuple[str, str]] | None:
    turns = conversation.get("conversations") if isinstance(conversation, dict) else None
    if not isinstance(turns, list):
        report.dropped["conversation without a 'conversations' list"] += 1
        return None
    out: list[tuple[str, str]] = []
    for turn in turns:
        role = _ROLES.get(str(turn.get("from", "")).lower()) if isinstance(turn, dict) else None
        text = turn.get("value") if isinstance(turn, dict) else None
        if role is None or not isinstance(text, str):
            report.dropped["turn with unknown 'from' or no text"] += 1
            continue
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + "\n" + text)
            report.adjusted["consecutive turns of one speaker merged"] += 1
            continue
        out.append((role, text))
    return out


def import_sharegpt(
    source: Path, *, endpoint: Endpoint = "openai.chat"
) -> tuple[Workload, ImportReport]:
    """Convert a ShareGPT JSON file. Raises WorkloadError if it is not a JSON array."""
    report = ImportReport(str(source))
    try:
        data = json.loads(source.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"{source}: cannot read ShareGPT JSON: {exc}") from exc
    if not isinstance(data, list):
        raise WorkloadError(f"{source}: ShareGPT must be a JSON array of conversations")
    words = WordTokenizer()
    builder = WorkloadBuilder(name=source.stem, source={"kind": "sharegpt", "path": str(source)})
    for index, conversation in enumerate(data):
        report.read["conversations"] += 1
        turns = _turns(conversation, report)
        if turns is None:
            continue
        system = turns[0][1] if turns and turns[0][0] == "system" else None
        turns = turns[1:] if system is not None else turns
        while turns and turns[0][0] == "assistant":
            turns = turns[1:]
            report.dropped["leading assistant turn"] += 1
        session = f"sg{index:06d}:{conversation.get('id', '')}"
        requests = 0
        for position in range(0, len(turns) - 1, 2):
            reply = turns[position + 1][1]
            if words.count(reply) == 0:
                report.dropped["empty assistant reply (no output length)"] += 1
                break
            call = RenderedCall(endpoint, system, tuple(turns[: position + 1]), None)
            builder.add(ObservedCall(call, session, 0.0, 0.0, words.count(reply), reply))
            requests += 1
        if len(turns) % 2 == 1:
            report.dropped["final human turn without a reply"] += 1
        if requests == 0:
            report.dropped["conversation with no answered human turn"] += 1
            continue
        report.read["requests"] += requests
    if not builder.entries:
        raise WorkloadError(f"{source}: no usable ShareGPT conversations")
    return builder.workload(), report
