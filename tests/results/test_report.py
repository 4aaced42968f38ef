from __future__ import annotations

import re

from autotune.report import (
    SWEEP_CONCURRENCY,
    concurrency_figure,
    outcome_figure,
    render_report,
    space_axes,
)
from autotune.study_reader import load_study

from .conftest import Point, build_study, on_the_catalog_gpu


def test_report_is_self_contained_with_plotly_inlined_once(study_url: str) -> None:
    page = render_report(load_study(study_url))
    assert page.count("plotly.js v") == 1  # the library banner: inlined exactly once
    assert not re.search(r"<script[^>]+src=", page)  # nothing fetched from the network
    assert "2.76x the baseline&#x27;s 220.38 (trial 0), measured" in page
    for title in (
        "Optimisation history",
        "Outcome classes across the space",
        "source: stored measurements",
        "Hyperparameter Importances",
        "Slice Plot",
        "Contour Plot",
    ):
        assert title in page
    assert "Pareto-front" not in page


def test_multi_objective_report_has_the_pareto_front(pareto_url: str) -> None:
    page = render_report(load_study(pareto_url))
    assert "Pareto-front Plot" in page


def test_outcome_map_puts_oom_trials_where_they_happened(study_url: str) -> None:
    loaded = load_study(study_url)
    assert space_axes(loaded) == ["kv-cache-memory-bytes", "max-num-seqs"]
    figure = outcome_figure(loaded)
    assert figure is not None
    traces = {trace.name: trace for trace in figure.data}
    assert sorted(traces["kv-does-not-fit"].x) == [12.5, 13.5, 14.0]
    assert max(traces["ok"].x) == 12.0


def test_sweep_of_best_and_baseline_comes_from_the_simulator(storage_url: str) -> None:
    points = [Point(6.0, "auto", 4, 0, baseline=True), Point(9.0, "fp8_e4m3", 16, 0)]
    build_study(storage_url, "s", points=points)
    on_the_catalog_gpu(storage_url, "s")
    figure = concurrency_figure(load_study(storage_url))
    assert figure is not None
    assert "simulator prediction (lines)" in figure.layout.title.text
    lines = {t.name: t for t in figure.data if t.mode == "lines+markers"}
    best = lines["best (trial 1), predicted closed loop"]
    baseline = lines["baseline (trial 0), predicted closed loop"]
    assert list(best.x) == list(SWEEP_CONCURRENCY)
    # max-num-seqs 4 caps the baseline: past 4 clients it cannot go faster; 16 slots can
    assert baseline.y[-1] == baseline.y[2]
    assert best.y[-1] > 1.2 * baseline.y[-1]
