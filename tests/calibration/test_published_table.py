"""The fidelity table's arithmetic on points with known errors: same-run groups that
disagree count once against their median, pairs compare GPU speed ratios, and a tie has no
ordering to get wrong."""

from __future__ import annotations

import math

import pytest

from autotune.calibration.published import PublishedPoint
from autotune.calibration.published_predict import PredictedFigures
from autotune.calibration.published_table import (
    PointResult,
    by_gpu,
    pairs,
    scored,
    summarize,
)


def _point(
    name: str, gpu: str, *, source: str = "a", rate: float = math.inf, pair: str | None = None,
    tok_s: float = 1000.0, tpot_ms: float = 10.0, ttft_ms: float = 100.0,
) -> PublishedPoint:  # fmt: skip
    return PublishedPoint.model_validate(
        {
            "id": name, "source_url": f"https://{source}.example/run", "gpu": gpu,
            "tensor_parallel": 1, "model": "Qwen/Qwen3-8B", "precision": "bf16", "pair": pair,
            "benchmark": {"tool": "vllm bench serve", "dataset": "random", "input_len": 512,
                          "output_len": 128, "num_prompts": 100, "request_rate": rate},
            "figures": {"output_throughput_tok_s": tok_s, "median_tpot_ms": tpot_ms,
                        "median_ttft_ms": ttft_ms},
        }
    )  # fmt: skip


def _result(point: PublishedPoint, tok_s: float, tpot_ms: float, ttft_ms: float) -> PointResult:
    figures = PredictedFigures(
        output_throughput_tok_s=tok_s, total_token_throughput_tok_s=tok_s * 5,
        request_throughput_rps=tok_s / 128, median_ttft_s=ttft_ms / 1e3, mean_ttft_s=None,
        median_tpot_s=tpot_ms / 1e3, mean_tpot_s=None,
    )  # fmt: skip
    return PointResult(point, figures)


def test_errors_and_per_gpu_medians() -> None:
    results = [
        _result(_point("p1", "h100-80g", tok_s=1000), 1100, 10, 150),  # +10%, 0%, +50%
        _result(_point("p2", "h100-80g", tok_s=1000), 800, 12, 100),  # -20%, +20%, 0%
        _result(_point("p3", "h100-80g", tok_s=1000), 1050, 9, 90),  # +5%, -10%, -10%
        _result(_point("p4", "a100-80g"), 1000, 10, 100),
    ]
    entries = scored(results)
    assert results[0].error("throughput") == pytest.approx(0.10)
    h100 = by_gpu(entries)["h100-80g"]
    assert h100.points == 3 and h100.sources == 1
    assert h100.median["throughput"] == pytest.approx(0.10)
    assert h100.worst["throughput"] == pytest.approx(0.20)
    assert h100.median["tpot"] == pytest.approx(0.10) and h100.median["ttft"] == pytest.approx(0.10)
    assert summarize(entries).points == 4


def test_runs_published_alike_that_disagree_count_once_against_their_median() -> None:
    agree = [
        _result(_point("x", "l40s-48g", source="a", tok_s=1000), 1300, 10, 100),
        _result(_point("y", "l40s-48g", source="b", tok_s=1050), 1300, 10, 100),
    ]
    entries = scored(agree)  # 5% apart: within the goal, each counts on its own
    assert [len(entry.results) for entry in entries] == [1, 1]
    assert entries[1].spread == pytest.approx(0.05)
    disagree = [
        _result(_point("x", "l40s-48g", source="a", tok_s=1000), 1300, 10, 100),
        _result(_point("y", "l40s-48g", source="b", tok_s=1600), 1300, 10, 100),
    ]
    (entry,) = scored(disagree)
    assert entry.spread == pytest.approx(0.6) and entry.sources == {"a.example", "b.example"}
    assert entry.error("throughput") == pytest.approx(1300 / 1300 - 1)  # median of 1000, 1600


def test_pairs_compare_speed_ratios_and_orderings() -> None:
    burst = [
        _result(_point("a", "a100-80g", pair="k", tok_s=1000), 1000, 20, 100),
        _result(_point("h", "h100-80g", pair="k", tok_s=1800), 2700, 10, 100),
    ]
    (pair,) = pairs(burst)
    assert pair.figure == "throughput" and pair.published_ratio == pytest.approx(1.8)
    assert pair.ratio_error == pytest.approx(2.7 / 1.8 - 1) and pair.ordered
    paced = [  # at a set rate both serve the same tok/s: speed is 1/TPOT
        _result(_point("a", "rtx4090-24g", pair="r", rate=4.0, tpot_ms=20), 500, 10, 100),
        _result(_point("h", "h100-pcie-80g", pair="r", rate=4.0, tpot_ms=10), 500, 12, 100),
    ]
    (pair,) = pairs(paced)
    assert pair.figure == "1/TPOT" and pair.published_ratio == pytest.approx(2.0)
    assert pair.predicted_ratio == pytest.approx(10 / 12) and not pair.ordered
    tie = [
        _result(_point("a", "rtx4090-24g", pair="t", tok_s=1000), 1000, 10, 100),
        _result(_point("h", "rtx6000ada-48g", pair="t", tok_s=1010), 900, 10, 100),
    ]
    assert pairs(tie)[0].ordered  # published 1% apart: no ordering to get wrong
