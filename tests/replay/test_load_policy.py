"""The load modes, budgets, windows and saturation verdict, against the policy itself.

Both replays (over HTTP, and in virtual time in the simulator) follow this
policy; tests/e2e/test_two_drivers.py checks that they agree with each other.
"""

from __future__ import annotations

import pytest

from autotune.replay.load import LoadSpec
from autotune.replay.load_policy import LoadPolicy, Send, rising_without_bound
from autotune.workload.plan import Message, PlannedRequest, WorkloadPlan
from tests.replay.conftest import make_plan


def _ids(sends: list[Send]) -> list[str]:
    return [send.record_id for send in sends]


def _drive(policy: LoadPolicy, service_s: float = 1.0) -> list[tuple[str, float, str | None]]:
    """Every request takes ``service_s``: (record id, send time, salt) in send order."""
    sent: list[tuple[str, float, str | None]] = []
    ending: list[tuple[float, Send]] = []
    while True:
        next_s = policy.next_send_s()
        times = [t for t in (next_s, min((t for t, _ in ending), default=None)) if t is not None]
        if not times:
            return sent
        now_s = min(times)
        for end_s, send in sorted((e for e in ending if e[0] <= now_s), key=lambda e: e[0]):
            ending.remove((end_s, send))
            policy.completed(end_s)
            policy.finished(send, end_s)
        for send in policy.due(now_s):
            sent.append((send.record_id, now_s, send.salt))
            ending.append((now_s + service_s, send))


def test_concurrency_keeps_n_in_flight_in_plan_order() -> None:
    policy = LoadPolicy(make_plan(sessions=5), LoadSpec(mode="concurrency", concurrency=2))
    first = policy.due(0.0)
    assert _ids(first) == ["s0-t0", "s1-t0"] and policy.next_send_s() is None
    policy.finished(first[1], 0.7)
    assert policy.next_send_s() == 0.7 and _ids(policy.due(0.7)) == ["s2-t0"]
    sent = _drive(LoadPolicy(make_plan(sessions=5), LoadSpec(mode="concurrency", concurrency=2)))
    assert [(rid, t) for rid, t, _ in sent] == [
        ("s0-t0", 0.0), ("s1-t0", 0.0), ("s2-t0", 1.0), ("s3-t0", 1.0), ("s4-t0", 2.0),
    ]  # fmt: skip


def test_sessions_send_each_turn_after_the_previous_plus_its_scaled_capped_gap() -> None:
    plan = make_plan(sessions=2, turns=3, gap_s=10.0)
    policy = LoadPolicy(plan, LoadSpec(mode="sessions", concurrency=2, timing_scale=2.0))
    assert _ids(policy.due(0.0)) == ["s0-t0", "s1-t0"]
    sent = dict((rid, t) for rid, t, _ in _drive(LoadPolicy(plan, policy.load)))
    assert sent["s0-t1"] == 1.0 + 5.0 and sent["s0-t2"] == 6.0 + 1.0 + 5.0  # gap / 2
    capped = LoadSpec(mode="sessions", concurrency=2, max_gap_s=3.0)
    sent = dict((rid, t) for rid, t, _ in _drive(LoadPolicy(plan, capped)))
    assert sent["s1-t1"] == 1.0 + 3.0


def test_a_session_slot_takes_the_next_session_when_the_last_turn_ends() -> None:
    plan = make_plan(sessions=3, turns=2)
    sent = _drive(LoadPolicy(plan, LoadSpec(mode="sessions", concurrency=1)))
    assert [(rid, t) for rid, t, _ in sent] == [
        ("s0-t0", 0.0), ("s0-t1", 1.0), ("s1-t0", 2.0), ("s1-t1", 3.0), ("s2-t0", 4.0),
        ("s2-t1", 5.0),
    ]  # fmt: skip


def _request(rid: str, thread: str, after: tuple[str, ...], session: str = "s") -> PlannedRequest:
    return PlannedRequest(
        id=rid, session=session, thread=thread, after=after, gap_s=0.0, arrival_s=0.0,
        endpoint="openai.chat", system=None, messages=(Message("user", rid),),
        prompt_tokens=1, output_tokens=1,
    )  # fmt: skip


def test_a_subagent_runs_beside_its_parent_and_the_join_waits_for_both() -> None:
    plan = WorkloadPlan(
        name="subagents",
        requests=(
            _request("main-0", "main", ()),
            _request("sa-0", "sa:explore", ("main-0",)),
            _request("main-1", "main", ("main-0",)),
            _request("main-2", "main", ("main-1", "sa-0")),
            _request("other-0", "main", (), session="other"),
        ),
        token_space="words",
        digest="x",
    )
    policy = LoadPolicy(plan, LoadSpec(mode="sessions", concurrency=1))
    (main0,) = policy.due(0.0)
    policy.finished(main0, 1.0)
    beside = policy.due(1.0)
    assert _ids(beside) == ["sa-0", "main-1"]
    policy.finished(beside[1], 2.0)
    assert policy.next_send_s() is None  # main-2 waits for the subagent too
    policy.finished(beside[0], 3.0)
    (join,) = policy.due(3.0)
    assert join.record_id == "main-2" and policy.next_send_s() is None
    policy.finished(join, 4.0)
    assert _ids(policy.due(4.0)) == ["other-0"]  # the next session, once all of "s" ended


def test_trace_sends_at_scaled_arrivals_with_capped_gaps() -> None:
    plan = make_plan(sessions=4, arrival_step_s=10.0)
    sent = _drive(LoadPolicy(plan, LoadSpec(mode="trace", timing_scale=2.0, max_gap_s=None)))
    assert [t for _, t, _ in sent] == [0.0, 5.0, 10.0, 15.0]
    sent = _drive(LoadPolicy(plan, LoadSpec(mode="trace", timing_scale=2.0, max_gap_s=3.0)))
    assert [t for _, t, _ in sent] == [0.0, 3.0, 6.0, 9.0]


def test_max_requests_closes_the_run_and_skips_what_is_left() -> None:
    plan = make_plan(sessions=4, turns=3)
    load = LoadSpec(mode="sessions", concurrency=2, max_requests=5)
    policy = LoadPolicy(plan, load)
    sent = _drive(policy)
    assert len(sent) == 5 and policy.closed and policy.next_send_s() is None
    assert policy.expected_total == 5


def test_duration_stops_sending_at_its_end() -> None:
    load = LoadSpec(mode="concurrency", concurrency=1, duration_s=3.5)
    policy = LoadPolicy(make_plan(sessions=10), load)
    sent = _drive(policy)
    assert [t for _, t, _ in sent] == [0.0, 1.0, 2.0, 3.0] and policy.closed
    assert not policy.may_send(3.5)


def test_recycling_fills_the_budget_with_fresh_salts_and_ids() -> None:
    plan = make_plan(sessions=2, turns=2)
    load = LoadSpec(mode="sessions", concurrency=2, recycle_sessions=True, max_requests=10)
    sent = _drive(LoadPolicy(plan, load))
    assert len(sent) == 10 and len({rid for rid, _, _ in sent}) == 10
    assert {salt for rid, _, salt in sent if rid.endswith("#1")} == {"recycle-1"}
    assert {salt for rid, _, salt in sent if "#" not in rid} == {None}
    unbounded = LoadPolicy(plan, LoadSpec(mode="sessions", recycle_sessions=True))
    assert not unbounded.recycling and len(_drive(unbounded)) == 4  # no budget: one round


def test_warmup_completions_are_out_of_the_window() -> None:
    policy = LoadPolicy(make_plan(sessions=4), LoadSpec(mode="concurrency", warmup_requests=2))
    assert policy.window_duration_s() is None
    assert [policy.completed(t) for t in (1.0, 1.5, 2.0, 4.0)] == [False, False, True, True]
    assert policy.window_duration_s() == 4.0 - 1.5


def test_closing_drops_what_is_pending_and_sends_nothing_more() -> None:
    policy = LoadPolicy(make_plan(sessions=2, turns=3, gap_s=5.0), LoadSpec(mode="sessions"))
    first = policy.due(0.0)
    policy.finished(first[0], 1.0)
    assert policy.next_send_s() == 6.0
    policy.close()
    policy.finished(first[1], 2.0)  # a request in flight ends after the close
    assert policy.next_send_s() is None and policy.due(100.0) == [] and policy.sent == 2


def test_a_stop_keeps_its_first_reason() -> None:
    policy = LoadPolicy(make_plan(sessions=2), LoadSpec(mode="concurrency"))
    policy.stop("saturated: first")
    policy.stop("server unreachable: later")
    assert policy.stop_reason == "saturated: first" and policy.closed
    assert policy.next_send_s() is None and policy.saturation(100, 100) is None


def test_rising_without_bound() -> None:
    assert rising_without_bound([0, 3, 9, 14, 20])
    assert not rising_without_bound([0, 3, 9, 14, 14])
    assert not rising_without_bound([0, 1, 2, 3, 4])  # rising but short
    assert not rising_without_bound([10, 12, 14])  # too few scrapes


def test_saturation_verdicts() -> None:
    queue = LoadPolicy(make_plan(), LoadSpec(mode="concurrency"))
    verdicts = [queue.saturation(waiting, 0) for waiting in (0, 3, 9, 14, 20)]
    assert verdicts[:-1] == [None] * 4
    assert verdicts[-1] == "saturated: server waiting queue rose to 20 over successive scrapes"
    trace = LoadPolicy(make_plan(), LoadSpec(mode="trace"))
    verdicts = [trace.saturation(None, backlog) for backlog in (1, 4, 8, 12, 30)]
    assert verdicts[-1] == "saturated: 30 requests unanswered and rising (open loop)"
    closed_loop = LoadPolicy(make_plan(), LoadSpec(mode="concurrency"))
    assert all(closed_loop.saturation(None, n) is None for n in (1, 4, 8, 12, 30))
    off = LoadPolicy(make_plan(), LoadSpec(mode="concurrency", saturation_stop=False))
    assert all(off.saturation(n, 0) is None for n in (0, 3, 9, 14, 20))


@pytest.mark.parametrize("mode", ["concurrency", "sessions", "trace"])
def test_an_empty_plan_sends_nothing(mode: str) -> None:
    empty = WorkloadPlan(name="empty", requests=(), token_space="words", digest="x")
    policy = LoadPolicy(empty, LoadSpec(mode=mode, recycle_sessions=True, max_requests=5))  # type: ignore[arg-type]
    assert policy.next_send_s() is None and policy.due(10.0) == []


def test_progress_reports_the_window_throughput_once_per_step_crossed() -> None:
    """One request at a time, each 1 s; the two warm-up requests are out of the window."""
    load = LoadSpec(mode="concurrency", concurrency=1, max_requests=10, warmup_requests=2)
    policy = LoadPolicy(make_plan(sessions=12), load)
    reports, tokens, now_s = [], 0, 0.0
    while (sends := policy.due(now_s)) or policy.next_send_s() is not None:
        now_s += 1.0
        out = 10 * len(reports) + 5  # output grows: the figure is cumulative
        if policy.completed(now_s, out):
            tokens += out
        policy.finished(sends[0], now_s)
        progress = policy.progress(now_s)
        if progress is not None:
            reports.append(progress)
            assert progress.output_tok_s == pytest.approx(tokens / (now_s - 2.0))
            assert progress.at_s == now_s
    # 8 window requests of 12.5% each; the last step (100%) is the trial's final value.
    assert [report.step for report in reports] == [10, 25, 35, 50, 60, 75, 85]


def test_trace_with_max_in_flight_holds_an_arrival_until_a_request_ends() -> None:
    # Arrivals every 0.25 s, each request takes 1 s, at most 2 in flight: vllm bench serve's
    # --request-rate 4 --max-concurrency 2 (a semaphore in front of the open loop).
    plan = make_plan(sessions=6, arrival_step_s=0.25)
    sent = _drive(LoadPolicy(plan, LoadSpec(mode="trace", max_in_flight=2)))
    assert [(rid, t) for rid, t, _ in sent] == [
        ("s0-t0", 0.0), ("s1-t0", 0.25), ("s2-t0", 1.0), ("s3-t0", 1.25), ("s4-t0", 2.0),
        ("s5-t0", 2.25),
    ]  # fmt: skip
    # A slot that frees before the next arrival waits for it: the open loop's own time.
    sparse = make_plan(sessions=3, arrival_step_s=5.0)
    sent = _drive(LoadPolicy(sparse, LoadSpec(mode="trace", max_in_flight=1)))
    assert [t for _, t, _ in sent] == [0.0, 5.0, 10.0]
    uncapped = _drive(LoadPolicy(plan, LoadSpec(mode="trace")))
    assert [t for _, t, _ in uncapped] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
