from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.errors import WorkloadError
from autotune.workload import WordTokenizer, load_plan, read_workload
from tests.workload.conftest import HEADER

WORDS = WordTokenizer()


def _request(rid: str, **fields: object) -> dict[str, object]:
    record: dict[str, object] = {"type": "request", "id": rid, "output": {"tokens": 5}}
    record.update(fields)
    return record


def _user(tokens: int) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"tokens": tokens}]}]


def _rendered_tokens(request) -> int:
    system = WORDS.count(request.system) if request.system else 0
    return system + sum(WORDS.count(m.text) for m in request.messages)


def test_delta_turn_extends_parent_prompt_and_response(write_jsonl: Callable[..., Path]) -> None:
    path = write_jsonl(
        [
            HEADER,
            {"type": "prefix", "id": "p", "system": [{"tokens": 100}]},
            _request("a", session="s", prefix="p", input={"mode": "full", "messages": _user(20)}),
            _request(
                "b",
                session="s",
                parent="a",
                gap_s=2.5,
                input={"mode": "delta", "append": _user(30)},
                output={"tokens": 7},
            ),
        ]
    )
    plan = load_plan(path)
    a, b = plan.requests
    assert a.prompt_tokens == 120
    assert b.prompt_tokens == 120 + 5 + 30  # parent prompt + parent response + new
    assert b.messages[0] is a.messages[0]  # history shared, not copied
    assert b.messages[1].role == "assistant" and WORDS.count(b.messages[1].text) == 5
    assert b.system == a.system
    assert b.after == ("a",) and b.arrival_s == pytest.approx(2.5)
    assert all(_rendered_tokens(r) == r.prompt_tokens for r in plan.requests)
    assert plan.digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_plans_are_byte_identical_across_loads(write_jsonl: Callable[..., Path]) -> None:
    path = write_jsonl(
        [
            HEADER,
            _request("a", session="s", input={"mode": "full", "messages": _user(50)}),
            _request("b", session="s", parent="a", input={"mode": "delta", "append": _user(9)}),
        ]
    )
    first, second = load_plan(path), load_plan(path)
    assert first.requests == second.requests


def test_hash_ids_share_text_by_scope(write_jsonl: Callable[..., Path]) -> None:
    def blocks(scope: str | None) -> dict[str, object]:
        part: dict[str, object] = {"tokens": 130, "hash_ids": [1, 2, 3]}
        if scope:
            part["scope"] = scope
        return {"mode": "full", "messages": [{"role": "user", "content": [part]}]}

    path = write_jsonl(
        [
            HEADER,
            _request("g1", session="s1", input=blocks("global")),
            _request("g2", session="s2", input=blocks("global")),
            _request("l1", session="s1", input=blocks(None)),
            _request("l2", session="s2", input=blocks(None)),
        ]
    )
    by_id = {r.id: r for r in load_plan(path).requests}
    assert by_id["g1"].messages == by_id["g2"].messages
    assert by_id["l1"].messages != by_id["l2"].messages  # session scope: no accidental sharing
    assert by_id["g1"].prompt_tokens == WORDS.count(by_id["g1"].messages[0].text) == 130


def test_blocks_mode_shares_exactly_the_common_blocks(write_jsonl: Callable[..., Path]) -> None:
    header = {**HEADER, "block_size": 4, "hash_scope": "global"}
    path = write_jsonl(
        [
            header,
            _request("a", input={"mode": "blocks", "hash_ids": [1, 2, 3], "tokens": 10}),
            _request("b", input={"mode": "blocks", "hash_ids": [1, 2, 4, 5], "tokens": 16}),
            _request(
                "c",
                input={
                    "mode": "blocks",
                    "hash_ids": [1, 2, 4, 5],
                    "tokens": 20,
                    "system_blocks": 1,
                },
            ),
        ]
    )
    a, b, c = load_plan(path).requests
    words_a = " ".join(m.text for m in a.messages).split()
    words_b = " ".join(m.text for m in b.messages).split()
    assert (a.prompt_tokens, b.prompt_tokens, c.prompt_tokens) == (10, 16, 20)
    assert len(words_a) == 10 and len(words_b) == 16
    assert words_a[:8] == words_b[:8]
    assert words_a[8:10] != words_b[8:10]
    assert c.system is not None and c.system.split() == words_b[:4]
    assert all(_rendered_tokens(r) == r.prompt_tokens for r in (a, b, c))


def test_keep_messages_truncates_history(write_jsonl: Callable[..., Path]) -> None:
    path = write_jsonl(
        [
            HEADER,
            _request("a", session="s", input={"mode": "full", "messages": _user(40)}),
            _request("b", session="s", parent="a", input={"mode": "delta", "append": _user(10)}),
            _request(
                "c",
                session="s",
                parent="b",
                input={"mode": "delta", "append": _user(3), "keep_messages": 1},
            ),
        ]
    )
    a, b, c = load_plan(path).requests
    assert len(b.messages) == 3 and len(c.messages) == 2
    assert c.messages[0] is a.messages[0]
    assert c.prompt_tokens == 40 + 3  # a's prompt kept, a's response and b's turn cut


def test_malformed_line_names_file_line_and_field(write_jsonl: Callable[..., Path]) -> None:
    path = write_jsonl(
        [
            HEADER,
            _request("a", input={"mode": "full", "messages": _user(4)}),
            _request("b", input={"mode": "full", "messages": _user(4)}, output={"tokens": -1}),
        ]
    )
    with pytest.raises(WorkloadError, match=rf"^{path}:3: output\.tokens: "):
        load_plan(path)


def test_unknown_reference_and_bad_json_are_line_errors(write_jsonl: Callable[..., Path]) -> None:
    path = write_jsonl(
        [HEADER, _request("b", parent="zz", input={"mode": "delta", "append": _user(4)})]
    )
    with pytest.raises(WorkloadError, match=r":2: parent: unknown request 'zz'"):
        read_workload(path)
    path = write_jsonl([HEADER, "{not json"], name="bad.jsonl")
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:2: invalid JSON at column 2: "):
        read_workload(path)


def test_skip_invalid_drops_bad_lines_and_their_dependents(
    write_jsonl: Callable[..., Path],
) -> None:
    path = write_jsonl(
        [
            HEADER,
            _request("a", session="s", input={"mode": "full", "messages": _user(4)}),
            _request("b", session="s", input={"mode": "nope"}),
            _request("c", session="s", parent="b", input={"mode": "delta", "append": _user(4)}),
            "garbage",
            _request("d", session="s", parent="a", input={"mode": "delta", "append": _user(4)}),
        ]
    )
    workload = read_workload(path, skip_invalid=True)
    assert [r.id for r in workload.requests] == ["a", "d"]
    assert [line.split(":")[0] for line in workload.skipped] == ["3", "4", "5"]
    assert len(load_plan(path, skip_invalid=True).requests) == 2


def test_unknown_version_is_a_clear_error(write_jsonl: Callable[..., Path]) -> None:
    path = write_jsonl([{**HEADER, "version": 7}])
    expected = r":1: version: unsupported autotune-workload version 7"
    with pytest.raises(WorkloadError, match=expected):
        load_plan(path)


def test_first_line_must_be_header(write_jsonl: Callable[..., Path]) -> None:
    path = write_jsonl([_request("a", input={"mode": "full", "messages": _user(4)})])
    with pytest.raises(WorkloadError, match=r":1: type: the first line must be the header"):
        load_plan(path, skip_invalid=True)
