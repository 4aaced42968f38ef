"""Objectives, SLO parsing and scoring (pure functions)."""

from __future__ import annotations

import pytest

from autotune.errors import InputError
from autotune.replay.records import Percentiles, ReplayStats
from autotune.trial.objective import (
    Goal,
    ObjectiveName,
    parse_objectives,
    parse_slo,
    request_slo,
    score,
)
from autotune.vocabulary import Failure, FailureClass


def stats(*, tok_s: float = 500.0, ttft_p95: float = 1.0, failed: int = 0) -> ReplayStats:
    return ReplayStats(
        duration_s=10.0,
        completed=20,
        failed=failed,
        total_input_tokens=1000,
        total_output_tokens=5000,
        request_throughput_rps=2.0,
        output_throughput_tok_s=tok_s,
        total_token_throughput_tok_s=600.0,
        goodput_rps=1.5,
        ttft=Percentiles(mean=0.5, p50=0.4, p90=0.9, p95=ttft_p95, p99=1.2),
        e2e=Percentiles(mean=5.0, p50=4.0, p90=8.0, p95=9.0, p99=12.0),
    )


@pytest.mark.parametrize(
    ("text", "metric", "stat", "limit_s"),
    [
        ("ttft_p95<=2s", "ttft", "p95", 2.0),
        ("tpot_p50<=80ms", "tpot", "p50", 0.08),
        ("e2e_p99 <= 1.5m", "e2e", "p99", 90.0),
        ("itl_mean<250ms", "itl", "mean", 0.25),
    ],
)
def test_parse_slo(text: str, metric: str, stat: str, limit_s: float) -> None:
    slo = parse_slo(text)
    assert (slo.metric, slo.stat) == (metric, stat)
    assert slo.limit_s == pytest.approx(limit_s)


@pytest.mark.parametrize(
    "text", ["ttft<=2s", "ttft_p95<=2", "ttft_p95>=2s", "foo_p95<=2s", "ttft_p95<=0s"]
)
def test_bad_slo_is_one_clear_line(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_slo(text)
    assert text in str(info.value)


def test_objectives() -> None:
    assert parse_objectives("throughput,latency") == [
        ObjectiveName.THROUGHPUT,
        ObjectiveName.LATENCY,
    ]
    with pytest.raises(InputError, match="unknown objective 'speed'"):
        parse_objectives("speed")


def test_feasible_trial_has_every_constraint_key_non_positive() -> None:
    goal = Goal([ObjectiveName.THROUGHPUT], [parse_slo("ttft_p95<=2s")])
    result = score(goal, stats=stats(), failure=None, memory_margin=-0.2)
    assert result.values == [500.0]
    assert result.outcome == "ok"
    assert set(result.constraints) == {"oom", "crash", "error_rate", "slo:ttft_p95"}
    assert result.constraints["slo:ttft_p95"] == pytest.approx(-0.5)
    assert result.feasible


def test_slo_miss_and_errors_are_graded_violations() -> None:
    goal = Goal([ObjectiveName.THROUGHPUT], [parse_slo("ttft_p95<=0.5s")])
    missed = score(goal, stats=stats(ttft_p95=1.0), failure=None)
    assert missed.outcome == "slo-violated"
    assert missed.constraints["slo:ttft_p95"] == pytest.approx(1.0)
    errors = score(goal, stats=stats(failed=2), failure=None)
    assert errors.outcome == "errors"
    assert errors.constraints["error_rate"] > 0


def test_oom_is_a_result_with_the_same_keys_and_no_value() -> None:
    goal = Goal([ObjectiveName.THROUGHPUT], [parse_slo("ttft_p95<=2s")])
    failure = Failure(failure_class=FailureClass.KV_DOES_NOT_FIT, message="No available memory")
    result = score(goal, stats=None, failure=failure, memory_margin=0.3)
    assert result.values is None
    assert result.outcome == "kv-does-not-fit"
    assert result.constraints["oom"] == pytest.approx(0.3)
    assert result.constraints["crash"] < 0
    assert set(result.constraints) == set(goal.constraint_keys)
    crash = score(
        goal, stats=None, failure=Failure(failure_class=FailureClass.ENGINE_DEAD, message="x")
    )
    assert crash.constraints["crash"] > 0 and crash.constraints["oom"] < 0


def test_goodput_thresholds_from_slos() -> None:
    slo = request_slo(
        [parse_slo("ttft_p95<=2s"), parse_slo("ttft_p99<=3s"), parse_slo("tpot_p50<=80ms")]
    )
    assert slo is not None
    assert slo.ttft_s == 2.0 and slo.tpot_s == pytest.approx(0.08) and slo.e2e_s is None
