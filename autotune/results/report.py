"""A self-contained HTML report of one study (plotly's JS inlined once; no network).

Sections: the measured headline (best vs baseline), the explanation, the
optimisation history, parameter importances, slice and contour plots, the
Pareto front (multi-objective studies), the concurrency curve, and where each
outcome class (OOM above all) lies in the space.
"""

from __future__ import annotations

import html
import math
import warnings
from collections.abc import Callable
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState
from optuna.visualization import (
    plot_contour,
    plot_param_importances,
    plot_pareto_front,
    plot_slice,
)

from autotune.config.trial_config import launched_value
from autotune.errors import InputError
from autotune.results.explain import (
    GIB,
    MIN_TRIALS_FOR_IMPORTANCE,
    explain,
    format_flag_value,
    measured_study,
    param_importances,
)
from autotune.results.reader import LoadedStudy, TrialRow
from autotune.results.study_inputs import catalog_gpu, sim_config, study_plan
from autotune.sim.virtual.predict import predict
from autotune.vocabulary import FailureClass, Outcome

OUTCOME_COLOURS = {
    Outcome.OK: "#2ca02c",
    Outcome.SLO_VIOLATED: "#ff7f0e",
    Outcome.ERRORS: "#bcbd22",
    Outcome.PREDICTED_OOM: "#9467bd",
    FailureClass.KV_DOES_NOT_FIT: "#d62728",
    FailureClass.CUDA_OOM_STARTUP: "#8c0000",
    FailureClass.CUDA_OOM_LOAD: "#e377c2",
}
OTHER_COLOUR = "#7f7f7f"
SWEEP_CONCURRENCY = (1, 2, 4, 8, 16, 32)  # the field notes' hand-run benchmark levels
# Every objective axis says what it measures and in which unit.
OBJECTIVE_AXIS = {
    "throughput": "output throughput (tok/s)",
    "goodput": "goodput (requests/s within SLOs)",
    "latency": "p95 end-to-end latency (s)",
}
MAX_LOG_TICKS = 8

CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2rem; } .sub { color: #666; margin-top: 0; }
.headline { font-size: 1.3rem; background: #f3f7ee; padding: 0.8rem 1rem; border-radius: 6px; }
table { border-collapse: collapse; margin: 1rem 0; }
td, th { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: left; }
th { background: #f4f4f4; } .note { color: #666; font-size: 0.9rem; }
"""


def objective_axis(objective: str) -> str:
    return OBJECTIVE_AXIS.get(objective, objective)


def log_ticks(low: float, high: float) -> list[int]:
    """Powers of two spanning [low, high], thinned to at most MAX_LOG_TICKS."""
    first = 2 ** math.floor(math.log2(max(low, 1e-9)))
    ticks = [first]
    while ticks[-1] < high:
        ticks.append(ticks[-1] * 2)
    step = math.ceil(len(ticks) / MAX_LOG_TICKS)
    return [int(t) if t >= 1 else t for t in ticks[::step]]


def readable_log_axes(figure: go.Figure) -> None:
    """Plotly labels a log axis 2, 5, 10, 2, 5, 100: put plain numbers at powers of two."""
    layout = figure.layout.to_plotly_json()
    for axis_name, axis in layout.items():
        if not axis_name.startswith(("xaxis", "yaxis")) or axis.get("type") != "log":
            continue
        letter = axis_name[0]
        ref = letter + axis_name[len(letter) + len("axis") :]  # xaxis2 -> x2
        values = [
            float(v)
            for trace in figure.data
            if (getattr(trace, f"{letter}axis", None) or letter) == ref
            for v in (getattr(trace, letter, None) or ())
            if isinstance(v, int | float) and not isinstance(v, bool) and v > 0
        ]
        if values:
            ticks = log_ticks(min(values), max(values))
            figure.layout[axis_name].update(tickvals=ticks, ticktext=[f"{t:,}" for t in ticks])


class _Figures:
    """Figures to HTML; plotly.js goes into the first one only.

    Each figure takes the page's width (no fixed width from Optuna's plots, which
    size a slice plot at 300 px per parameter and would be cut off), with readable
    log-axis ticks.
    """

    def __init__(self) -> None:
        self.js_included = False

    def html(self, figure: go.Figure) -> str:
        figure.update_layout(
            width=None, autosize=True, height=420, margin={"l": 60, "r": 30, "t": 50, "b": 50}
        )
        readable_log_axes(figure)
        text = figure.to_html(
            full_html=False,
            include_plotlyjs=not self.js_included,
            default_width="100%",
            config={"responsive": True},
        )
        self.js_included = True
        return text


def _first_value(trial: optuna.trial.FrozenTrial) -> float:
    return trial.values[0]


def _figure(build: Callable[[], go.Figure]) -> go.Figure | None:
    """Optuna's plots warn or refuse on tiny studies; a missing plot is not an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return build()
        except (ValueError, RuntimeError, ZeroDivisionError):
            return None


def history_figure(loaded: LoadedStudy) -> go.Figure:
    """Every trial by number: measured values, best-so-far, failures along the floor."""
    objective = loaded.info.primary_objective
    figure = go.Figure()
    measured = [r for r in loaded.trials if r.measured and r.values]
    feasible = [r for r in measured if r.feasible]
    floor = min((r.values[0] for r in measured), default=0.0)
    for label, rows, symbol in (
        ("measured, feasible", feasible, "circle"),
        ("measured, infeasible", [r for r in measured if not r.feasible], "x"),
    ):
        figure.add_scatter(
            x=[r.number for r in rows],
            y=[r.values[0] for r in rows],
            mode="markers",
            name=label,
            marker={"symbol": symbol, "size": 9},
            text=[r.outcome for r in rows],
        )
    best_so_far, best = [], None
    for row in sorted(feasible, key=lambda r: r.number):
        value = loaded.primary_key(row)
        best = value if best is None else max(best, value)
        best_so_far.append(best if loaded.info.primary_maximize else -best)
    figure.add_scatter(
        x=[r.number for r in sorted(feasible, key=lambda r: r.number)],
        y=best_so_far,
        mode="lines",
        name="best so far",
        line={"shape": "hv"},
    )
    failed = [r for r in loaded.trials if not r.measured]
    figure.add_scatter(
        x=[r.number for r in failed],
        y=[floor] * len(failed),
        mode="markers",
        name="no measurement (OOM, crash, ...)",
        marker={"symbol": "triangle-down", "size": 10, "color": "#d62728"},
        text=[r.outcome for r in failed],
    )
    figure.update_layout(
        title="Optimisation history", xaxis_title="trial", yaxis_title=objective_axis(objective)
    )
    return figure


def _axis_value(row: TrialRow, name: str) -> float | None:
    value = row.flags.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value / GIB if name.endswith("-bytes") else float(value)


def _axis_title(name: str) -> str:
    return f"{name} (GiB)" if name.endswith("-bytes") else name


def space_axes(loaded: LoadedStudy) -> list[str]:
    """The two numeric flags that vary most across trials (KV pool first when it varies)."""
    spread: dict[str, set[float]] = {}
    for row in loaded.trials:
        for name in row.flags:
            value = _axis_value(row, name)
            if value is not None:
                spread.setdefault(name, set()).add(value)
    names = [n for n, seen in spread.items() if len(seen) > 1]
    names.sort(key=lambda n: (n != "kv-cache-memory-bytes", -len(spread[n])))
    return names[:2]


def outcome_figure(loaded: LoadedStudy) -> go.Figure | None:
    """Each trial in the two main numeric flags, coloured by outcome: where OOM lives."""
    axes = space_axes(loaded)
    if not axes:
        return None
    x_name = axes[0]
    y_name = axes[1] if len(axes) > 1 else None
    figure = go.Figure()
    by_outcome: dict[str, list[TrialRow]] = {}
    for row in loaded.trials:
        if _axis_value(row, x_name) is not None:
            by_outcome.setdefault(row.outcome or row.state.lower(), []).append(row)
    for outcome, rows in sorted(by_outcome.items()):
        figure.add_scatter(
            x=[_axis_value(r, x_name) for r in rows],
            y=[_axis_value(r, y_name) if y_name else 0 for r in rows],
            mode="markers",
            name=outcome,
            marker={"size": 12, "color": OUTCOME_COLOURS.get(outcome, OTHER_COLOUR)},
            text=[f"trial {r.number}" for r in rows],
        )
    figure.update_layout(
        title="Outcome classes across the space",
        xaxis_title=_axis_title(x_name),
        yaxis_title=_axis_title(y_name) if y_name else "",
    )
    if y_name and y_name == "max-num-seqs":
        figure.update_yaxes(type="log")
    return figure


def _marks(loaded: LoadedStudy) -> list[tuple[str, TrialRow, str]]:
    """(label, trial, colour) for the best and the baseline, once if they are one trial."""
    best = loaded.best() if loaded.feasible_measured() else None
    baseline = loaded.baseline()
    if best is not None and baseline is not None and best.number == baseline.number:
        return [("best = baseline", best, "#2ca02c")]
    marks = [("best", best, "#2ca02c"), ("baseline", baseline, "#7f7f7f")]
    return [(label, row, colour) for label, row, colour in marks if row is not None]


def predicted_sweep(
    loaded: LoadedStudy, row: TrialRow, concurrencies: tuple[int, ...] = SWEEP_CONCURRENCY
) -> list[tuple[int, float | None]]:
    """Output tok/s of ``row``'s config at each closed-loop concurrency, as the simulator
    predicts it over the study's workload (None where it fails). Raises ``InputError``."""
    if row.config is None:
        raise InputError(f"trial {row.number} stored no config")
    plan, load = study_plan(loaded)
    config = sim_config(row.config, catalog_gpu(loaded))
    points = []
    for concurrency in concurrencies:
        closed_loop = load.model_copy(
            update={
                "mode": "concurrency",
                "concurrency": concurrency,
                "max_requests": None,
                "duration_s": None,
                "saturation_stop": False,
            }
        )
        prediction = predict(config, plan, closed_loop)
        ok = prediction.failure is None
        points.append((concurrency, prediction.stats.output_throughput_tok_s if ok else None))
    return points


def concurrency_figure(loaded: LoadedStudy) -> go.Figure | None:
    """Throughput against requests at once: the simulator's sweep of best and baseline
    (simulated studies), over the stored measurements of every trial."""
    rows = [r for r in loaded.trials if r.measured and r.concurrency_reached]
    figure = go.Figure()
    source = "stored measurements"
    if loaded.info.engine == "sim":
        try:
            for label, row, colour in _marks(loaded):
                points = predicted_sweep(loaded, row)
                figure.add_scatter(
                    x=[c for c, _ in points],
                    y=[tok_s for _, tok_s in points],
                    mode="lines+markers",
                    name=f"{label} (trial {row.number}), predicted closed loop",
                    line={"color": colour},
                )
            source = "simulator prediction (lines) and stored measurements (points)"
        except InputError:
            figure = go.Figure()  # the workload or catalog entry is gone: data only
    if not rows and not figure.data:
        return None
    figure.add_scatter(
        x=[r.concurrency_reached for r in rows],
        y=[r.throughput_tok_s for r in rows],
        mode="markers",
        name="measured trials",
        marker={"size": 9, "color": "#1f77b4"},
        text=[f"trial {r.number}" for r in rows],
    )
    for label, row, colour in _marks(loaded):
        if row.measured and row.concurrency_reached:
            figure.add_scatter(
                x=[row.concurrency_reached],
                y=[row.throughput_tok_s],
                mode="markers+text",
                name=f"{label} (trial {row.number}), measured",
                text=[label],
                textposition="top center",
                marker={"size": 16, "color": colour, "symbol": "star"},
            )
    figure.update_layout(
        title=f"Output throughput vs requests at once<br><sup>source: {source}</sup>",
        xaxis_title="requests running at once",
        yaxis_title="output throughput (tok/s)",
    )
    figure.update_xaxes(type="log", tickvals=list(SWEEP_CONCURRENCY))
    return figure


def _headline_table(loaded: LoadedStudy) -> str:
    best = loaded.best() if loaded.feasible_measured() else None
    baseline = loaded.baseline()
    columns = [(label, row) for label, row in (("best", best), ("baseline", baseline)) if row]
    if not columns:
        return ""

    def cell(value: object) -> str:
        return f"<td>{html.escape(str(value))}</td>"

    def fmt(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    metrics: list[tuple[str, Callable[[TrialRow], str]]] = [
        ("trial", lambda r: str(r.number)),
        ("outcome", lambda r: r.outcome or r.state),
        ("output tok/s", lambda r: fmt(r.throughput_tok_s, ",.1f")),
        ("p95 TTFT (s)", lambda r: fmt(r.ttft_p95_s, ".3f")),
        ("p95 TPOT (s)", lambda r: fmt(r.tpot_p95_s, ".4f")),
        ("KV cache tokens", lambda r: fmt(r.kv_cache_tokens, ",")),
        ("peak running", lambda r: str(r.concurrency_reached or "n/a")),
    ]
    flag_names = list(dict.fromkeys(n for _, row in columns for n in row.flags))
    rows_html = ["<tr><th></th>" + "".join(f"<th>{label}</th>" for label, _ in columns) + "</tr>"]
    for name, getter in metrics:
        rows_html.append(f"<tr><th>{name}</th>" + "".join(cell(getter(r)) for _, r in columns))
    for name in flag_names:
        rows_html.append(
            f"<tr><th>--{html.escape(name)}</th>"
            + "".join(cell(format_flag_value(name, r.flags.get(name))) for _, r in columns)
        )
    return "<table>" + "</tr>".join(rows_html) + "</tr></table>"


def _holding(distribution: BaseDistribution, values: set[Any]) -> BaseDistribution:
    """``distribution`` widened to hold ``values`` (values a derived rule launched)."""
    if isinstance(distribution, CategoricalDistribution):
        known = list(distribution.choices)
        choices = known + [value for value in values if value not in known]
        if all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices):
            choices.sort()
        return CategoricalDistribution(choices)
    if isinstance(distribution, IntDistribution):
        low, high = min(distribution.low, *values), max(distribution.high, *values)
        return IntDistribution(low, high, log=distribution.log)
    if isinstance(distribution, FloatDistribution):
        low, high = min(distribution.low, *values), max(distribution.high, *values)
        return FloatDistribution(low, high, log=distribution.log)
    return distribution


def launched_study(loaded: LoadedStudy) -> optuna.Study:
    """``measured_study`` with each trial at the values it launched: where a derived rule
    replaced a searched value (2N-1 batched tokens with MTP and LMCache on), the plots
    that place trials on a parameter's axis show what ran, not what was searched."""
    measured = measured_study(loaded)
    flags = {row.number: row.flags for row in loaded.trials}
    launched: dict[int, dict[str, Any]] = {}
    replaced: dict[str, set[Any]] = {}
    for trial in measured.get_trials(deepcopy=False):
        params = {}
        for name, searched in trial.params.items():
            value, changed = launched_value(name, searched, flags.get(trial.number, {}))
            params[name] = value
            if changed:
                replaced.setdefault(name, set()).add(value)
        launched[trial.number] = params
    if not replaced:
        return measured
    copy = optuna.create_study(directions=loaded.study.directions)
    for trial in measured.get_trials(deepcopy=False):
        distributions = {
            name: _holding(dist, replaced[name]) if name in replaced else dist
            for name, dist in trial.distributions.items()
        }
        copy.add_trial(_moved(trial, launched[trial.number], distributions))
    return copy


def _moved(
    trial: FrozenTrial, params: dict[str, Any], distributions: dict[str, BaseDistribution]
) -> FrozenTrial:
    complete = trial.state == TrialState.COMPLETE
    return optuna.trial.create_trial(
        state=trial.state,
        params=params,
        distributions=distributions,
        values=trial.values if complete else None,
    )


def _optuna_figures(loaded: LoadedStudy) -> list[go.Figure]:
    study = measured_study(loaded)
    placed = launched_study(loaded)  # slice and contour: trials where they launched
    target = _first_value
    name = objective_axis(loaded.info.primary_objective)
    figures: list[go.Figure | None] = []
    if len(loaded.feasible_measured()) >= MIN_TRIALS_FOR_IMPORTANCE:
        figures.append(
            _figure(lambda: plot_param_importances(study, target=target, target_name=name))
        )
        figures.append(_figure(lambda: plot_slice(placed, target=target, target_name=name)))
        top = list(param_importances(loaded))[:2]
        if len(top) == 2:
            figures.append(
                _figure(lambda: plot_contour(placed, params=top, target=target, target_name=name))
            )
    if loaded.multi_objective:
        everything = measured_study(loaded, feasible_only=False)
        figures.append(
            _figure(
                lambda: plot_pareto_front(
                    everything, target_names=[objective_axis(o) for o in loaded.info.objectives]
                )
            )
        )
    return [f for f in figures if f is not None]


def report_figures(loaded: LoadedStudy) -> list[go.Figure]:
    """Every plot of the report, in page order."""
    plots = [history_figure(loaded), outcome_figure(loaded), concurrency_figure(loaded)]
    plots += _optuna_figures(loaded)
    return [figure for figure in plots if figure is not None]


def render_report(loaded: LoadedStudy) -> str:
    """The whole HTML page as text."""
    info = loaded.info
    figures = _Figures()
    sections = explain(loaded)
    headline = " ".join(sections[1].sentences[:1]) if len(sections) > 1 else ""
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>autotune report: {html.escape(loaded.name)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>autotune report: {html.escape(loaded.name)}</h1>",
        f"<p class='sub'>{html.escape(str(info.model))} on {html.escape(info.gpu_name)}; "
        f"engine {html.escape(str(info.engine))} {html.escape(str(info.engine_version))}; "
        f"workload {html.escape(info.workload_name)}; objective "
        f"{html.escape(', '.join(info.objectives))}"
        f"{'; SLOs ' + html.escape(', '.join(info.slos)) if info.slos else ''}</p>",
        f"<p class='headline'>{html.escape(headline)}</p>",
        _headline_table(loaded),
    ]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2><ul>")
        parts += [f"<li>{html.escape(s)}</li>" for s in section.sentences]
        parts.append("</ul>")
    parts.append("<h2 id='plots'>Plots</h2>")
    parts += [figures.html(figure) for figure in report_figures(loaded)]
    parts.append(
        "<p class='note'>Importance, slice and contour plots use the measured feasible "
        "trials only; OOM and crashed trials carry placeholder values.</p></body></html>"
    )
    return "\n".join(parts)
