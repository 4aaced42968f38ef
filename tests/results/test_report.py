from __future__ import annotations

import re

from autotune.report import outcome_figure, render_report, space_axes
from autotune.study_reader import load_study


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
