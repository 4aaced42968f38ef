"""The plan on the terminal (a ranked table) and as an HTML page with its plot."""

from __future__ import annotations

import html

from rich.table import Table

from autotune.fleet.candidates import Candidate
from autotune.results.compare import flags_summary


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def _headroom(candidate: Candidate) -> str:
    if candidate.replicas is None:
        return "-"
    if candidate.breaks_on is None:
        return f">= {candidate.headroom:.2g}x"
    return f"{candidate.headroom:.2g}x"


def row_cells(rank: int, candidate: Candidate) -> list[str]:
    """One candidate as table cells (terminal and HTML alike)."""
    stats = candidate.fleet.stats if candidate.fleet else None
    return [
        str(rank) if candidate.replicas is not None else "-",
        candidate.gpu
        + (f" TP {candidate.tp}" if candidate.tp > 1 else "")
        + (" (cal.)" if candidate.calibrated else ""),
        _fmt(candidate.replicas, "d"),
        _fmt(candidate.gpus, "d"),
        _fmt(candidate.usd_per_hour, ",.2f"),
        _fmt(candidate.output_tok_s, ",.0f"),
        _fmt(candidate.usd_per_million_tokens, ",.2f"),
        _fmt(stats.ttft.p95 if stats else None, ".2f", " s"),
        _fmt(stats.tpot.p95 if stats else None, ".3f", " s"),
        _headroom(candidate),
    ]


def details(candidate: Candidate) -> list[str]:
    """What sets the replica count, and the config (the lines under the table)."""
    config = flags_summary(dict(candidate.config.flags)) if candidate.config else "-"
    above = f"above {_headroom(candidate)}: {candidate.breaks_on}" if candidate.breaks_on else ""
    return [candidate.binding + (f"; {above}" if above else ""), f"TP {candidate.tp}, {config}"]


HEADERS = [
    "#", "GPU", "replicas", "GPUs", "$/hour", "out tok/s", "$/M out tok",
    "p95 TTFT", "p95 TPOT", "headroom",
]  # fmt: skip
DETAIL_HEADERS = ["sets the count", "config"]


def why_lost(candidate: Candidate, winner: Candidate | None) -> str | None:
    """Why ``candidate`` is not the plan (None: it is ``winner``, the cheapest fleet)."""
    if candidate is winner:
        return None
    if candidate.usd_per_hour is None or winner is None or winner.usd_per_hour is None:
        return candidate.binding  # no fleet of it meets the limits, and why
    mine, theirs = _fleet(candidate), _fleet(winner)
    if candidate.usd_per_hour > winner.usd_per_hour:
        return f"costs more: {mine} against {theirs}"
    return (
        f"as cheap per hour as {theirs}, ranked after it on $ per million output tokens: "
        f"{_fmt(candidate.usd_per_million_tokens, ',.2f')} against "
        f"{_fmt(winner.usd_per_million_tokens, ',.2f')}"
    )


def _fleet(candidate: Candidate) -> str:
    """``2 x h100-80g TP 2 at $10.00/hour``."""
    tp = f" TP {candidate.tp}" if candidate.tp > 1 else ""
    return f"{candidate.replicas} x {candidate.gpu}{tp} at ${candidate.usd_per_hour:,.2f}/hour"


def plan_table(candidates: list[Candidate], title: str) -> Table:
    """The ranked candidates, cheapest first."""
    table = Table(title=title)
    for header in HEADERS:
        table.add_column(header, justify="left" if header == "GPU" else "right")
    for rank, candidate in enumerate(candidates, start=1):
        table.add_row(*row_cells(rank, candidate))
    return table


def plan_lines(candidates: list[Candidate]) -> list[str]:
    """Per candidate: what sets its replica count, and its config."""
    return [f"{c.gpu}: {'; '.join(details(c))}" for c in candidates]


def plan_html(candidates: list[Candidate], title: str, notes: list[str]) -> str:
    """A self-contained page: cost against GPUs, each SLO's margin, and the table."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    planned = [c for c in candidates if c.fleet is not None and c.fleet.stats is not None]
    figure = make_subplots(
        rows=1, cols=2, subplot_titles=("$/hour against GPUs", "SLO margin at the target load")
    )
    for candidate in planned:
        figure.add_trace(
            go.Scatter(
                x=[candidate.gpus], y=[candidate.usd_per_hour], mode="markers+text",
                text=[candidate.gpu], textposition="top center", name=candidate.gpu,
                marker={"size": 14},
            ),
            row=1, col=1,
        )  # fmt: skip
    keys = sorted({key for c in planned for key in c.fleet.margins if key.startswith("slo:")})  # type: ignore[union-attr]
    for key in keys:
        figure.add_trace(
            go.Bar(
                x=[c.gpu for c in planned],
                y=[-c.fleet.margins[key] for c in planned],  # type: ignore[union-attr]
                name=f"{key[4:]} slack (1 - value/limit)",
            ),
            row=1, col=2,
        )  # fmt: skip
    figure.update_xaxes(title_text="GPUs", row=1, col=1)
    figure.update_yaxes(title_text="USD per hour", row=1, col=1)
    figure.update_yaxes(title_text="slack", tickformat=".0%", row=1, col=2)
    figure.update_layout(title=title, height=480)
    rows = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(cell)}</td>" for cell in [*row_cells(i, c), *details(c)])
        + "</tr>"
        for i, c in enumerate(candidates, start=1)
    )
    head = "".join(f"<th>{html.escape(h)}</th>" for h in [*HEADERS, *DETAIL_HEADERS])
    lines = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;"
        "padding:4px 8px;font-size:13px}table{border-collapse:collapse}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><ul>{lines}</ul>"
        + figure.to_html(full_html=False, include_plotlyjs=True)
        + f"<table><tr>{head}</tr>{rows}</table></body></html>"
    )
