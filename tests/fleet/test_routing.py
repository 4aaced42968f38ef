"""The plan's router: sessions round robin, each request once, the load shared out."""

from __future__ import annotations

from pathlib import Path

from autotune.fleet.routing import most_replicas, scaled, split_load, split_plan
from autotune.replay.load import LoadSpec
from autotune.workload.expand import load_plan

SAMPLE = Path(__file__).parents[2] / "workloads" / "sample-claudecode.jsonl"


def test_sessions_go_round_robin_and_every_request_once() -> None:
    plan = load_plan(SAMPLE)
    parts = split_plan(plan, 3)
    assert sorted(r.id for part in parts for r in part.requests) == sorted(
        r.id for r in plan.requests
    )
    for replica, part in enumerate(parts):
        assert part.sessions == plan.sessions[replica::3]  # session k -> replica k mod 3
        assert [r.id for r in part.requests] == [
            r.id for r in plan.requests if r.session in part.sessions
        ]  # in arrival order


def test_the_load_is_shared_and_raised() -> None:
    load = LoadSpec(mode="sessions", concurrency=8)
    assert [share.concurrency for share in split_load(load, 3)] == [3, 3, 2]
    assert scaled(load, 1.5).concurrency == 12
    trace = LoadSpec(mode="trace", timing_scale=2.0)
    assert split_load(trace, 2) == [trace, trace]
    assert scaled(trace, 1.5).timing_scale == 3.0
    plan = load_plan(SAMPLE)  # 7 sessions: at most 7 replicas are busy
    assert most_replicas(plan, LoadSpec(mode="sessions", concurrency=40)) == 7
    assert most_replicas(plan, load) == 7
