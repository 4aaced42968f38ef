"""compute_stats follows `vllm bench serve`'s definitions on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.replay.load import RequestSlo
from autotune.replay.records import RequestError, RequestRecord
from autotune.replay.stats import ItlHistogram, compute_stats, max_concurrency, records_frame


def _record(i: int, **kwargs: object) -> RequestRecord:
    fields: dict[str, object] = {
        "id": f"r{i}",
        "endpoint": "openai.chat",
        "send_s": float(i),
        "ttft_s": 0.1 * (i + 1),
        "e2e_s": 1.0 + i,
        "output_tokens": 11,
        "prompt_tokens": 100,
        "chunks": 11,
        "itl_mean_s": 0.1,
        "itl_max_s": 0.3,
    }
    fields.update(kwargs)
    return RequestRecord(**fields)


def test_throughputs_and_percentiles_follow_vllm_definitions() -> None:
    records = [_record(i) for i in range(4)]
    stats = compute_stats(records, duration_s=8.0)
    assert stats.completed == 4 and stats.failed == 0
    assert stats.total_output_tokens == 44 and stats.total_input_tokens == 400
    assert stats.request_throughput_rps == pytest.approx(0.5)
    assert stats.output_throughput_tok_s == pytest.approx(5.5)
    assert stats.total_token_throughput_tok_s == pytest.approx(55.5)
    ttfts = [0.1, 0.2, 0.3, 0.4]
    assert stats.ttft.mean == pytest.approx(0.25)
    assert stats.ttft.p90 == pytest.approx(float(np.percentile(ttfts, 90)))
    # TPOT = (e2e - ttft) / (out - 1)
    tpots = [((1.0 + i) - 0.1 * (i + 1)) / 10 for i in range(4)]
    assert stats.tpot.p50 == pytest.approx(float(np.median(tpots)))
    assert stats.e2e.p99 == pytest.approx(float(np.percentile([1, 2, 3, 4], 99)))


def test_default_duration_spans_first_send_to_last_completion() -> None:
    stats = compute_stats([_record(0), _record(2)])  # 0..1 and 2..5
    assert stats.duration_s == pytest.approx(5.0)


def test_warmup_records_and_failures() -> None:
    records = [
        _record(0, in_window=False),
        _record(1),
        _record(2, error=RequestError.TIMEOUT, ttft_s=None, output_tokens=0),
        _record(3, error=RequestError.HTTP_5XX, http_status=500, ttft_s=None),
    ]
    stats = compute_stats(records, duration_s=10.0)
    assert stats.completed == 1 and stats.failed == 2
    assert stats.errors_by_class == {"timeout": 1, "http-5xx": 1}
    assert stats.error_rate == pytest.approx(2 / 3)
    assert stats.total_output_tokens == 11  # failed and warm-up requests do not count


def test_goodput_counts_requests_meeting_every_slo() -> None:
    records = [_record(i) for i in range(4)]  # ttft 0.1..0.4, e2e 1..4
    slo = RequestSlo(ttft_s=0.35, e2e_s=2.5)
    stats = compute_stats(records, duration_s=2.0, slo=slo)
    assert stats.goodput_rps == pytest.approx(1.0)  # r0 and r1
    assert compute_stats(records, duration_s=2.0).goodput_rps is None


def test_one_token_request_has_no_tpot_but_meets_tpot_slo() -> None:
    record = _record(0, output_tokens=1, chunks=1, itl_mean_s=None, itl_max_s=None)
    stats = compute_stats([record], duration_s=1.0, slo=RequestSlo(tpot_s=0.001))
    assert stats.tpot.mean is None
    assert stats.goodput_rps == pytest.approx(1.0)


def test_max_concurrency_sweeps_intervals() -> None:
    records = [
        _record(0, send_s=0.0, e2e_s=10.0),
        _record(1, send_s=1.0, e2e_s=1.0),  # ends at 2.0
        _record(2, send_s=2.0, e2e_s=1.0),  # starts as r1 ends: not overlapping
        _record(3, send_s=2.5, e2e_s=1.0),
    ]
    assert max_concurrency(records) == 3


def test_itl_histogram_matches_exact_percentiles() -> None:
    gaps = np.random.default_rng(7).lognormal(mean=-4.0, sigma=1.0, size=50_000)
    histogram = ItlHistogram()
    for chunk in np.array_split(gaps, 100):
        histogram.add_many(chunk)
    summary = histogram.percentiles()
    assert summary.mean == pytest.approx(float(gaps.mean()))
    for q, value in ((50, summary.p50), (95, summary.p95), (99, summary.p99)):
        assert value == pytest.approx(float(np.percentile(gaps, q)), rel=0.01)
    stats = compute_stats([_record(0)], duration_s=1.0, itl=histogram)
    assert stats.itl == summary


def test_itl_without_histogram_weights_request_means_by_gap_count() -> None:
    records = [
        _record(0, chunks=3, itl_mean_s=0.1),  # 2 gaps
        _record(1, chunks=7, itl_mean_s=0.4),  # 6 gaps
    ]
    stats = compute_stats(records, duration_s=1.0)
    assert stats.itl.mean == pytest.approx((2 * 0.1 + 6 * 0.4) / 8)
    assert stats.itl.p50 == pytest.approx(0.4)


def test_records_frame_has_one_row_per_request_and_tpot() -> None:
    frame = records_frame([_record(0), _record(1, error=RequestError.MALFORMED)])
    assert list(frame["id"]) == ["r0", "r1"]
    assert frame.loc[1, "error"] == "malformed"
    assert frame.loc[0, "tpot_s"] == pytest.approx((1.0 - 0.1) / 10)
    assert "tpot_s" in records_frame([]).columns
