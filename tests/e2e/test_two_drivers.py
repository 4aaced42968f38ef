"""The two drivers of the load policy agree: one plan, one load, replayed over HTTP against
the simulator process and predicted in virtual time in-process, for each load mode.

Same requests sent, in the same order (per session in sessions mode: concurrent
sessions interleave as the wall clock falls), the same counts, token counts and
progress steps. Throughput and latency are compared in lockstep (docs/replay.md),
where they are equal: over the wall clock at TIME_SCALE, a hiccup of d seconds
costs d x TIME_SCALE modelled seconds, and a loaded host moves the figures as far
as it likes (32.0 against 50.7 output tok/s on 2 cores at load 10).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

import pytest

from autotune.replay.load import LoadSpec
from autotune.replay.load_policy import Progress
from autotune.replay.records import ReplayStats, RequestRecord
from autotune.replay.runner import replay
from autotune.sim.server.flags import parse_serve_args
from autotune.sim.virtual.predict import predict
from autotune.workload.expand import expand
from autotune.workload.gen import ChatParams, ClaudeCodeParams, chat, claudecode, fixed
from autotune.workload.plan import WorkloadPlan
from tests.e2e.conftest import SIM_ARGS, SimFactory, start_sims

pytestmark = [pytest.mark.timeout(120)]

TIME_SCALE = 5.0


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFactory]:
    yield from start_sims(tmp_path_factory.mktemp("sim"))


@pytest.fixture(scope="module")
def sim_url(sims: SimFactory) -> str:
    return sims(TIME_SCALE)


def _agents() -> WorkloadPlan:
    """Agent sessions with subagents, answers cut to 48 tokens to keep the run short."""
    params = ClaudeCodeParams(
        sessions=4, seed=3, user_turns=1, tool_steps_mean=2.0, requests_per_session=3,
        prefix_tokens=600, subagent_prefix_tokens=400, max_context=8000, subagent_rate=0.5,
        session_stagger_s=5.0,
    )  # fmt: skip
    plan = expand(claudecode(params), name="agents")
    short = tuple(replace(r, output_tokens=min(r.output_tokens, 48)) for r in plan.requests)
    return replace(plan, requests=short)


CHAT = ChatParams(requests=12, rate_rps=2.0, prompt_tokens_median=200, output_tokens_median=24)
CASES = {
    "concurrency": (
        lambda: expand(fixed(requests=14, prompt_tokens=300, output_tokens=24), name="fixed"),
        LoadSpec(mode="concurrency", concurrency=4, max_requests=12, warmup_requests=2),
    ),
    "sessions": (_agents, LoadSpec(mode="sessions", concurrency=2, max_gap_s=1.0)),
    "trace": (
        lambda: expand(chat(CHAT), name="chat"),
        LoadSpec(mode="trace", max_gap_s=2.0),
    ),
}


def _in_send_order(records: list[RequestRecord]) -> list[RequestRecord]:
    return sorted(records, key=lambda record: record.send_s)


def _per_session(records: list[RequestRecord]) -> dict[str | None, list[str]]:
    sessions: dict[str | None, list[str]] = {}
    for record in _in_send_order(records):
        sessions.setdefault(record.session, []).append(record.id)
    return sessions


def _figures(stats: ReplayStats) -> dict[str, float | None]:
    return {
        "output tok/s": stats.output_throughput_tok_s,
        "TTFT": stats.ttft.mean,
        "TPOT": stats.tpot.mean,
        "e2e": stats.e2e.mean,
    }


@pytest.mark.parametrize("mode", list(CASES))
def test_http_and_virtual_drivers_agree(sim_url: str, mode: str) -> None:
    make_plan, load = CASES[mode]
    plan = make_plan()
    seen: list[Progress] = []  # what a pruner would see over HTTP
    over_http = asyncio.run(
        replay(
            url=sim_url,
            plan=plan,
            load=load,
            model_name="",
            server_time_scale=TIME_SCALE,
            on_progress=lambda progress: seen.append(progress) is not None,
        )
    )
    virtual = predict(parse_serve_args(list(SIM_ARGS)).sim, plan, load)
    assert virtual.failure is None

    http_records, virtual_records = over_http.records, virtual.records
    assert len(http_records) == len(virtual_records) > 0
    if mode == "sessions":  # sessions start in plan order; each one's turns in order
        assert _per_session(http_records) == _per_session(virtual_records)
        firsts = [ids[0] for ids in _per_session(virtual_records).values()]
        assert [r.id for r in _in_send_order(http_records) if r.id in firsts] == firsts
    else:
        assert [r.id for r in _in_send_order(http_records)] == [
            r.id for r in _in_send_order(virtual_records)
        ]

    http_stats, virtual_stats = over_http.stats, virtual.stats
    for field in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
        assert getattr(http_stats, field) == getattr(virtual_stats, field), field
    assert http_stats.stopped_early is None and virtual_stats.stopped_early is None
    by_id = {record.id: record for record in virtual_records}
    for record in http_records:
        twin = by_id[record.id]
        assert (record.prompt_tokens, record.output_tokens, record.in_window) == (
            twin.prompt_tokens, twin.output_tokens, twin.in_window
        )  # fmt: skip

    # The same progress steps (their figures: the lockstep test below).
    assert [p.step for p in seen] == [p.step for p in virtual.progress] != []


@pytest.mark.parametrize("mode", list(CASES))
def test_in_lockstep_the_http_replay_measures_what_the_virtual_replay_predicts(
    sims: SimFactory, mode: str
) -> None:
    """Lockstep (the replay holds the simulator's clock): no wall time in any figure, so the
    replay over HTTP and the prediction in-process agree to the last digit, request by
    request, whatever else the host is doing. A fresh server each: an empty prefix cache."""
    make_plan, load = CASES[mode]
    plan = make_plan()
    seen: list[Progress] = []
    over_http = asyncio.run(
        replay(
            url=sims(TIME_SCALE),
            plan=plan,
            load=load,
            model_name="",
            server_time_scale=TIME_SCALE,
            on_progress=lambda progress: seen.append(progress) is not None,
            lockstep=True,
        )
    )
    virtual = predict(parse_serve_args(list(SIM_ARGS)).sim, plan, load)
    assert [r.id for r in _in_send_order(over_http.records)] == [
        r.id for r in _in_send_order(virtual.records)
    ]
    by_id = {record.id: record for record in virtual.records}
    for record in over_http.records:
        twin = by_id[record.id]
        for field in ("send_s", "ttft_s", "e2e_s", "tpot_s"):  # (chat's role chunk: ITL apart)
            assert getattr(record, field) == pytest.approx(getattr(twin, field), rel=1e-9), field
        assert (record.output_tokens, record.in_window) == (twin.output_tokens, twin.in_window)
    assert [(p.step, p.output_tok_s) for p in seen] == [
        (p.step, pytest.approx(p.output_tok_s, rel=1e-9)) for p in virtual.progress
    ]
    measured, predicted = _figures(over_http.stats), _figures(virtual.stats)
    assert measured == pytest.approx(predicted, rel=1e-9)
    assert over_http.stats.stopped_early is None
