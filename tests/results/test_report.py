from __future__ import annotations

import re

from autotune.results.reader import load_study
from autotune.results.report import (
    SWEEP_CONCURRENCY,
    concurrency_figure,
    log_ticks,
    outcome_figure,
    readable_log_axes,
    render_report,
    report_figures,
    space_axes,
)

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


def _axes(figure) -> dict[str, dict]:
    return {k: v for k, v in figure.layout.to_plotly_json().items() if k[1:].startswith("axis")}


def _titles(figure) -> list[str]:
    titles = [axis.get("title", {}).get("text") or "" for axis in _axes(figure).values()]
    for trace in figure.data:
        colorbar = getattr(getattr(trace, "marker", None), "colorbar", None)
        if colorbar is not None and colorbar.title.text:
            titles.append(colorbar.title.text)
    return titles


def test_every_throughput_axis_names_its_unit(study_url: str, pareto_url: str) -> None:
    """Before: the history's y axis read "throughput" and Optuna's plots "Objective Value"."""
    for url in (study_url, pareto_url):
        figures = report_figures(load_study(url))
        titles = [title for figure in figures for title in _titles(figure)]
        throughput = [t for t in titles if "throughput" in t or "tok/s" in t or "Objective" in t]
        assert len(throughput) >= 3, titles
        assert all(t == "output throughput (tok/s)" for t in throughput), throughput


def test_log_axes_read_as_plain_numbers(study_url: str) -> None:
    """Before: plotly's 2, 5, 10, 2, 5, 100 on max-num-seqs and the slice plots."""
    assert log_ticks(1, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert log_ticks(1024, 16384) == [1024, 2048, 4096, 8192, 16384]
    assert len(log_ticks(1, 100_000)) <= 8
    log_axes = 0
    for figure in report_figures(load_study(study_url)):
        readable_log_axes(figure)
        for axis in _axes(figure).values():
            if axis.get("type") == "log":
                log_axes += 1
                assert axis["ticktext"] == [f"{t:,}" for t in axis["tickvals"]]
                assert all(t & (t - 1) == 0 for t in axis["tickvals"])  # powers of two
    assert log_axes >= 2  # the outcome map's max-num-seqs and the slice plot's
