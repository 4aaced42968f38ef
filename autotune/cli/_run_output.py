"""What `autotune run` says, on stdout and in the study's log file.

Overnight runs are read afterwards: every line the run prints also goes to
``run.log`` beside the study's trial logs. When stdout is not a terminal
(``> run.log``, a pipe) the live display gives way to plain lines, one per
phase and per finished trial, and the full trial table ends the run.
"""

from __future__ import annotations

import shlex
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autotune.cli.progress import Best, FanOut, PlainProgress, RichProgress, Tally
from autotune.errors import InputError
from autotune.redaction import redact
from autotune.results.load_bound import study_tie, tie_sentences
from autotune.results.reader import LoadedStudy, TrialRow
from autotune.trial.objective import METRIC_NAMES, ObjectiveName
from autotune.tuner.record import TunerStudyRecord, WarmStartSummary, Winner

# Best vs baseline: a latency this much worse is called out, not left in the numbers.
WORSE_LATENCY = 0.05
DRIFT_WORTH_SAYING = 5e-4  # drift per trial a summary mentions (1.5% over 30 trials)
LATENCIES = (("p95 TTFT", "ttft_p95_s", "ttft_p95"), ("p95 TPOT", "tpot_p95_s", "tpot_p95"))


class RunOutput:
    """stdout plus the log file: ``say`` prints to both, ``observer`` shows progress.
    Every line is redacted of secrets first, on the screen as in the file."""

    def __init__(self, out: Console, log_path: Path) -> None:
        self.out = out
        self.log_path = log_path
        self._stack = ExitStack()
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] = self._stack.enter_context(log_path.open("a", encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"log file {log_path}: {exc.strerror}") from exc
        self.log = Console(file=self._file, width=200, color_system=None, soft_wrap=True)

    def close(self) -> None:
        self._stack.close()

    def say(self, markup: str, *, highlight: bool = False) -> None:
        self.out.print(redact(markup), highlight=highlight, soft_wrap=True)
        self.log_only(markup)

    def log_only(self, markup: str) -> None:
        self.log.print(redact(markup), highlight=False)
        self._file.flush()

    def _plain_line(self, text: str) -> None:
        text = redact(text)
        if not self.out.is_terminal:
            self.out.print(text, highlight=False, soft_wrap=True, markup=False)
            self.out.file.flush()
        self.log.print(text, highlight=False, markup=False)
        self._file.flush()

    def progress(self, tally: Tally, metric: str) -> tuple[Any, Any]:
        """(context manager, observer): live on a terminal, plain lines otherwise."""
        plain = PlainProgress(self._plain_line, tally, metric=metric)
        if self.out.is_terminal:
            live = RichProgress(self.out, tally, metric=metric)
            return live, FanOut(live, plain)
        return plain, plain


def resume_line(loaded: LoadedStudy) -> str:
    """The resume banner, from the same reading of the study as the final summary."""
    done = sum(1 for row in loaded.trials if row.state == "COMPLETE")
    plural = "s" if done != 1 else ""
    text = f"Resuming study [bold]{loaded.name}[/bold]: {done} trial{plural} complete"
    best = best_or_none(loaded)
    value = loaded.value_of(best) if best is not None else None
    if best is not None and value is not None:
        metric = METRIC_NAMES[ObjectiveName(loaded.info.primary_objective)]
        text += f", best {value:,.1f} {metric} (trial {best.number})"
    return text + "."


def best_or_none(loaded: LoadedStudy) -> TrialRow | None:
    try:
        return loaded.best()
    except InputError:
        return None


def best_so_far(loaded: LoadedStudy) -> Best | None:
    """What the live display starts from on a resumed study: the crown, by its mean."""
    best = best_or_none(loaded)
    value = loaded.value_of(best) if best is not None else None
    if best is None or value is None:
        return None
    winner = loaded.crowned()
    return Best(best.number, value, winner.measurements if winner is not None else 1)


def summary_lines(loaded: LoadedStudy) -> list[str]:
    """The end-of-run summary: best, gain, latency against the baseline, the command."""
    best = best_or_none(loaded)
    if best is None:
        show = escape(loaded.command("show"))
        lines = [f"[red]No feasible configuration yet[/red] (see: {show})."]
        warm = TunerStudyRecord.read(loaded.study.user_attrs).warm_start
        if warm and warm.predicted_feasible == 0:
            lines.append(
                f"  none of {warm.effective_configs:,} configs was predicted to meet the "
                "limits either: relax the SLO or slice the workload (autotune workload slice)"
            )
        return lines
    metric = METRIC_NAMES[ObjectiveName(loaded.info.primary_objective)]
    value = loaded.value_of(best)
    winner = loaded.crowned()
    runs = winner.measurements if winner is not None else 1
    mean_text = f" (mean of {runs} runs)" if runs > 1 else ""
    gain = loaded.gain_over_baseline(best)
    gain_text = f", {gain:.2f}x the baseline" if gain else ""
    lines = [
        f"\n[bold green]Best: trial {best.number}[/bold green]: "
        f"{value if value is not None else float('nan'):,.1f} {metric}{mean_text}{gain_text}"
    ]
    lines += latency_lines(loaded, best)
    tie = study_tie(loaded)
    if tie is not None:
        lines += [f"  [yellow]warning:[/yellow] {sentence}" for sentence in tie_sentences(tie)]
    lines += tuner_lines(loaded, metric)
    if best.config is not None:
        lines.append("  " + shlex.join(["vllm", "serve", *best.config.vllm_args()]))
    lines.append(f"  export it: {escape(loaded.command('export'))}")
    return lines


def tuner_lines(loaded: LoadedStudy, metric: str) -> list[str]:
    """What the warm start predicted, how often the crowned config was measured and
    which configs it tied with."""
    lines = []
    record = TunerStudyRecord.read(loaded.study.user_attrs)
    warm, winner = record.warm_start, record.winner
    if warm:
        seeds = f"the {warm.seeds} best (diverse) were tried first"
        lines.append(f"  {warm_start_sentence(warm)}; {seeds}")
    if winner and winner.measurements > 1:
        lines.append(
            f"  measured {winner.measurements} times (trials "
            f"{', '.join(str(t) for t in winner.trials)}): "
            f"spread {winner.spread:,.1f} {metric} about the mean above"
        )
    if winner and winner.tied_with:
        lines.append(f"  {tie_sentence(winner)}")
    if winner and (drift := drift_sentence(winner, metric)):
        lines.append(f"  {drift}")
    return lines


def drift_sentence(winner: Winner, metric: str) -> str | None:
    """The drift the re-measurements showed, when it is large enough to say (0.05% a
    trial: 1.5% over 30 trials)."""
    drift = winner.drift_per_trial
    if abs(drift) < DRIFT_WORTH_SAYING:
        return None
    return (
        f"re-measurements show the {metric} drifting {100 * drift:+.2f}% a trial over the "
        "run (the hardware, not the configs); configs were compared with it taken out "
        "(docs/tuner.md, drift and odd runs)"
    )


def warm_start_sentence(warm: WarmStartSummary) -> str:
    """What the warm start predicted, and what the latest run did of it (no timings: two
    runs of one study on machines of any speed say the same, unless the safety stop
    fired)."""
    total = warm.effective_configs
    if warm.unpredicted:
        text = (
            f"warm start: predicted {total - warm.unpredicted:,} of {total:,} effective "
            f"configs that fit; the other {warm.unpredicted:,} were never predicted (the "
            "search reaches them last)"
        )
    elif warm.replayed_configs is not None:
        text = (
            f"warm start: {total:,} effective configs fit, all screened, "
            f"{warm.replayed_configs:,} replayed"
        )
    else:
        text = f"warm start: {total:,} effective configs fit, all predicted"
    text += f", {warm.predicted_feasible:,} predicted feasible"
    if warm.predicted_now is not None:
        known = total - warm.unpredicted
        if warm.replayed_configs is not None:
            known = warm.replayed_configs
        stored = known - warm.predicted_now
        verb = "replayed" if warm.replayed_configs is not None else "predicted"
        text += f"; this run {verb} {warm.predicted_now:,}"
        text += f" ({stored:,} were stored)" if stored > 0 else ""
    if warm.safety_stop_s is not None:
        text += f", stopped by the {warm.safety_stop_s:g}-s safety stop (warm_start_budget_s)"
    return text


def tie_sentence(winner: Winner) -> str:
    """The crowned config tied with others: which one was handed over, and why."""
    plural = "s" if winner.tied_with != 1 else ""
    return (
        f"tied with {winner.tied_with} other config{plural} within the measurement noise; "
        "crowned the one that needs least (smaller max-num-seqs, CUDA-graph capture, KV "
        "memory, no MTP: docs/tuner.md)"
    )


def latency_lines(loaded: LoadedStudy, best: TrialRow) -> list[str]:
    """Best vs baseline latency, and a warning for each one clearly worse."""
    baseline = loaded.baseline()
    if baseline is None or baseline.number == best.number or baseline.replay is None:
        return []
    parts, worse = [], []
    for label, attr, slo in LATENCIES:
        ours, theirs = getattr(best, attr), getattr(baseline, attr)
        if ours is None or theirs is None or not theirs:
            continue
        change = ours / theirs - 1
        parts.append(f"{label} {_seconds(ours)} vs {_seconds(theirs)} ({change:+.0%})")
        if change > WORSE_LATENCY:
            worse.append((label, change, slo, theirs))
    if not parts:
        return []
    lines = [f"  latency vs the baseline (trial {baseline.number}): " + ", ".join(parts)]
    for label, change, slo, theirs in worse:
        limit = f"{slo}<={_seconds(theirs)}"
        lines.append(
            f"  [yellow]warning:[/yellow] {label} is {change:.0%} worse than the baseline's: "
            f"interactive users wait longer. To keep it, rerun with --slo '{limit}' or "
            f"export the best trial within it: {escape(loaded.command('export', '--slo', limit))} "
            "(docs/results.md)."
        )
    return lines


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def trials_table(loaded: LoadedStudy) -> Table:
    """Every trial of the study in number order: outcome, value, wall time."""
    metric = METRIC_NAMES[ObjectiveName(loaded.info.primary_objective)]
    table = Table(title=f"{loaded.name}: {len(loaded.trials)} trials")
    for column in ("trial", "outcome", metric, "wall"):
        table.add_column(column, justify="left" if column == "outcome" else "right")
    for row in sorted(loaded.trials, key=lambda r: r.number):
        value = f"{row.values[0]:,.1f}" if row.values and row.measured else "-"
        wall = f"{row.wall_s:.0f}s" if row.wall_s is not None else "-"
        why = "baseline" if row.is_baseline else row.reason
        outcome = row.outcome_text + (f" ({why})" if why else "")
        table.add_row(str(row.number), outcome, value, wall)
    return table
