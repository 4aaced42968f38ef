"""What `autotune show` prints, and the run's closing table of its best trials: the
trials best first (the crowned config's on top), their flags, outcome, score, the
deciding margin and server stats, with a line under the table for each mark it uses."""

from __future__ import annotations

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from autotune.cli._run_output import drift_sentence, tie_sentence, warm_start_sentence
from autotune.config.trial_config import launched_value
from autotune.errors import InputError
from autotune.results.reader import LoadedStudy, TrialRow
from autotune.results.study_inputs import study_plan
from autotune.trial.objective import METRIC_NAMES, ObjectiveName
from autotune.tuner.record import TunerStudyRecord
from autotune.workload.stats import IdealPrefixHits

WIDE_SHOW_COLUMNS = 160  # below this width `show` lists parameters under the table
MARGIN_LEGEND = (
    "margin: the limit that decides the trial, as measured / limit - 1 (oom: memory needed "
    "/ available - 1; slo:NAME: the SLO's): below 0 within it, above 0 past it"
)


def print_show(out: Console, loaded: LoadedStudy, *, limit: int | None = None) -> None:
    """The trials of ``loaded``, best first (the first ``limit``), on ``out``."""
    metric = METRIC_NAMES[ObjectiveName(loaded.info.primary_objective)]
    table = Table(title=f"{loaded.name} ({loaded.info.engine}, {loaded.info.gpu_name})")
    table.add_column("#", justify="right")
    table.add_column("outcome")
    table.add_column(metric, justify="right")
    param_names = sorted({name for row in loaded.trials for name in row.params})
    wide = out.width >= WIDE_SHOW_COLUMNS
    if wide:  # a column per parameter; on a narrow terminal they follow the table
        for name in param_names:
            table.add_column(name, justify="right")
    table.add_column("margin", justify="right")
    table.add_column("KV tokens", justify="right")
    table.add_column("peak run", justify="right")
    table.add_column("prefix hit", justify="right")
    table.add_column("ideal hit", justify="right")
    table.add_column("preempt", justify="right")
    crown = loaded.crowned()
    crowned = set(crown.trials) if crown else set()
    rows = sorted(loaded.trials, key=lambda row: _show_order(loaded, row, crowned))[:limit]
    ideal = _ideal_hits(loaded)
    for row in rows:
        table.add_row(*_show_cells(row, param_names if wide else [], ideal, row.number in crowned))
    out.print(table)
    if crown is not None:
        out.print(
            f"winner: trial {crown.trial}, measured {_times(crown.measurements)} "
            f"(trials {', '.join(map(str, crown.trials))}): mean {crown.mean:,.1f}, "
            f"spread {crown.spread:,.1f} {metric}; a row below it with a higher single "
            "measurement is best by one run, which noise can explain",
            highlight=False,
        )
    if crown is not None and crown.tied_with:
        out.print(tie_sentence(crown), highlight=False, soft_wrap=True)
    if crown is not None and (drift := drift_sentence(crown, metric)):
        out.print(drift, highlight=False, soft_wrap=True)
    warm = TunerStudyRecord.read(loaded.study.user_attrs).warm_start
    if warm is not None:
        out.print(warm_start_sentence(warm), highlight=False, soft_wrap=True)
    if any("*" in effective_cell(row, name) for row in rows for name in param_names):
        out.print(
            "* the value the trial launched with, set by a derived rule over the searched one"
        )
    if any(row.constraints for row in rows):
        out.print(MARGIN_LEGEND, highlight=False)
    if ideal is None:
        out.print("ideal hit: unknown (the study's workload file is gone or changed)")
    if not wide:
        for row in rows:
            pairs = " ".join(f"{name}={effective_cell(row, name)}" for name in param_names)
            out.print(f"#{row.number}: {pairs}", highlight=False, soft_wrap=True)


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _show_order(loaded: LoadedStudy, row: TrialRow, crowned: set[int]) -> tuple[int, float, int]:
    """The crowned config's trials first, then feasible, measured, the rest; best first."""
    if row.number in crowned:
        return (-1, -loaded.primary_key(row), row.number)
    if row.feasible and row.measured:
        return (0, -loaded.primary_key(row), row.number)
    if row.measured:
        return (1, -loaded.primary_key(row), row.number)
    return (2, 0.0, row.number)


def _ideal_hits(loaded: LoadedStudy) -> IdealPrefixHits | None:
    """The workload's prefix hits with an infinite cache, beside the server's; None when
    the study's workload file is gone or changed."""
    try:
        plan, _ = study_plan(loaded)
    except (InputError, ValidationError):
        return None
    return IdealPrefixHits(plan)


def _show_cells(
    row: TrialRow,
    param_names: list[str],
    ideal: IdealPrefixHits | None = None,
    crowned: bool = False,
) -> list[str]:
    outcome = row.outcome_text
    if row.is_baseline:
        outcome += " (baseline)"
    if crowned:
        outcome += " (winner)"
    style = "green" if row.feasible and row.measured else "red" if row.is_oom else "yellow"
    value = f"{row.values[0]:,.1f}" if row.values and row.measured else "-"
    if row.state == "PRUNED" and row.values:  # the replay's figure when it stopped
        value = f"({row.values[0]:,.1f} so far)"
    worst = _deciding_margin(row.constraints)
    stats = row.server_stats
    hit = stats.prefix_cache_hit_rate if stats else None
    best = ideal.ratio(stats.block_size) if ideal is not None and stats is not None else None
    return [
        str(row.number),
        f"[{style}]{outcome}[/{style}]",
        value,
        *(effective_cell(row, name) for name in param_names),
        f"{worst[0]} {worst[1]:+.2f}" if worst else "-",
        _cell(row.kv_cache_tokens),
        _cell(row.concurrency_reached),
        f"{100 * hit:.1f}%" if hit is not None else "-",
        f"{100 * best:.1f}%" if best is not None else "-",
        _cell(stats.preemptions if stats else None),
    ]


def _deciding_margin(constraints: dict[str, float]) -> tuple[str, float] | None:
    """The margin that explains the outcome: oom, crash or the worst violation; for a
    feasible trial the tightest SLO or memory margin (how close it came to a limit)."""
    for key in ("oom", "crash"):
        if constraints.get(key, -1.0) > 0:
            return key, constraints[key]
    violated = {k: v for k, v in constraints.items() if v > 0}
    if violated:
        return max(violated.items(), key=lambda item: item[1])
    limits = {k: v for k, v in constraints.items() if k == "oom" or k.startswith("slo:")}
    return max(limits.items(), key=lambda item: item[1]) if limits else None


def effective_cell(row: TrialRow, name: str) -> str:
    """A parameter as the trial launched it: where a derived rule replaced the searched
    value (2N-1 batched tokens), the flag's value, marked ``*``."""
    value, replaced = launched_value(name, row.params.get(name), row.flags)
    return f"{_cell(value)}*" if replaced else _cell(value)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
