from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.workload import load_plan
from autotune.workload.stats import workload_stats
from tests.workload.conftest import HEADER


def _blocks(rid: str, hash_ids: list[int], tokens: int, **fields: object) -> dict[str, object]:
    return {
        "type": "request",
        "id": rid,
        "input": {"mode": "blocks", "hash_ids": hash_ids, "tokens": tokens},
        "output": {"tokens": 5},
        **fields,
    }


def test_prefix_hit_ratio_and_distributions_match_hand_computed(
    write_jsonl: Callable[..., Path],
) -> None:
    path = write_jsonl(
        [
            {**HEADER, "block_size": 4, "hash_scope": "global"},
            _blocks("a", [1, 2, 3], 12, t_s=0.0),
            _blocks("b", [1, 2, 4], 12, t_s=1.0),  # first two blocks as in a: 8 tokens hit
            _blocks("c", [5], 4, t_s=2.0, output={"tokens": 9}),
            _blocks("d", [1, 2, 3], 10, t_s=3.0),  # 2 full 4-token blocks of a: 8 hit
        ]
    )
    stats = workload_stats(load_plan(path), block_size=4)
    assert stats.requests == 4 and stats.sessions == 0 and stats.independent_requests == 4
    assert stats.prefix_hit_ratio == pytest.approx((8 + 8) / (12 + 12 + 4 + 10))
    assert stats.input_tokens.p50 == pytest.approx(11.0)  # of 4, 10, 12, 12
    assert stats.input_tokens.max == 12 and stats.input_tokens.total == 38
    assert stats.output_tokens.p90 == pytest.approx(7.8)  # 5, 5, 5, 9: 5 + 0.7 * 4
    assert stats.duration_s == pytest.approx(3.0)


def test_sessions_concurrency_and_duration(write_jsonl: Callable[..., Path]) -> None:
    def req(rid: str, session: str, t_s: float, parent: str | None = None) -> dict[str, object]:
        record: dict[str, object] = {
            "type": "request",
            "id": rid,
            "session": session,
            "t_s": t_s,
            "output": {"tokens": 3},
        }
        if parent:
            record["parent"] = parent
            record["input"] = {"mode": "delta", "append": [{"role": "user", "content": "go on"}]}
        else:
            record["input"] = {"mode": "full", "messages": [{"role": "user", "content": "hi"}]}
        return record

    path = write_jsonl(
        [
            HEADER,
            req("a1", "s1", 0.0),
            req("b1", "s2", 5.0),
            req("a2", "s1", 10.0, parent="a1"),
            req("b2", "s2", 20.0, parent="b1"),
            req("c1", "s3", 30.0),
        ]
    )
    stats = workload_stats(load_plan(path), block_size=1)
    assert (stats.sessions, stats.threads, stats.requests) == (3, 3, 5)
    assert stats.peak_concurrent_sessions == 2  # s1 [0, 10] overlaps s2 [5, 20]; s3 alone
    assert stats.duration_s == pytest.approx(30.0)
    # a2 = "hi" + 3 response words + "go on": its first 4 tokens were a1's prompt + ... only
    # "hi" (1 token) was seen before; b1 repeats a1's "hi" exactly.
    assert stats.input_tokens.total == 1 + 1 + 6 + 6 + 1
    hits = 0 + 1 + 1 + 1 + 1
    assert stats.prefix_hit_ratio == pytest.approx(hits / 15)
