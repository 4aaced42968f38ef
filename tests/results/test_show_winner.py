"""The tuner's crowned config: `autotune show` lists it first, even below a lucky single
run, and every command quotes it by the mean of its runs."""

from __future__ import annotations

import json

import optuna
import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.cli._run_output import best_so_far, resume_line, summary_lines
from autotune.cli.progress import PlainProgress, Tally
from autotune.results.compare import compare_rows
from autotune.results.explain import headline_sentences
from autotune.results.export import render
from autotune.results.reader import load_study
from autotune.tuner.record import TunerStudyRecord, Winner
from tests.results.conftest import build_study


def _show_rows(storage_url: str) -> tuple[list[str], str]:
    result = CliRunner().invoke(
        app, ["show", "--storage", storage_url, "--study", "s"], env={"COLUMNS": "250"}
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    return rows, result.stdout


def test_show_lists_the_crowned_config_first_and_says_why(storage_url: str) -> None:
    study = build_study(storage_url, "s")
    feasible = [t for t in study.trials if t.user_attrs.get("outcome") == "ok"]
    by_value = sorted(feasible, key=lambda t: -t.values[0])
    lucky, crowned = by_value[0], by_value[1]  # the crown is not the best single run
    TunerStudyRecord(
        winner=Winner(
            trial=crowned.number,
            trials=[crowned.number],
            mean=crowned.values[0],
            spread=0.0,
            measurements=1,
        )
    ).write(optuna.load_study(study_name="s", storage=storage_url))
    rows, text = _show_rows(storage_url)
    first = rows[0].split("│")
    assert first[1].strip() == str(crowned.number) and "(winner)" in first[2], rows[0]
    assert rows[1].split("│")[1].strip() == str(lucky.number)
    assert sum("(winner)" in row for row in rows) == 1
    assert f"winner: trial {crowned.number}, measured once" in text


def test_a_crown_measured_several_times_is_quoted_by_its_mean_everywhere(
    storage_url: str,
) -> None:
    """Before: the run summary, `explain`, `compare` and `export` quoted the crowned trial's first
    run (a lucky one, often: that is how it took the lead) and its gain over the
    baseline, while the line below said the mean of its re-measurements was lower."""
    study = build_study(storage_url, "s")
    feasible = [t for t in study.trials if t.user_attrs.get("outcome") == "ok"]
    crowned = max(feasible, key=lambda t: t.values[0])
    mean = crowned.values[0] * 0.9  # its re-measurements came in lower
    TunerStudyRecord(
        winner=Winner(
            trial=crowned.number,
            trials=[crowned.number, 90, 91],
            mean=mean,
            spread=1.0,
            measurements=3,
        )
    ).write(optuna.load_study(study_name="s", storage=storage_url))
    loaded = load_study(storage_url, "s")
    baseline = loaded.baseline()
    assert baseline is not None and baseline.values
    gain = mean / baseline.values[0]
    summary = " ".join(summary_lines(loaded))
    assert (
        f"Best: trial {crowned.number}[/bold green]: {mean:,.1f} output_tok_s "
        f"(mean of 3 runs), {gain:.2f}x the baseline" in summary
    ), summary
    assert f"{crowned.values[0]:,.1f} output_tok_s" not in summary
    assert f"measured 3 times (trials {crowned.number}, 90, 91): spread 1.0" in summary
    assert f"best {mean:,.1f} output_tok_s (trial {crowned.number})" in resume_line(loaded)
    (row,) = compare_rows([loaded])
    assert row.output_throughput_tok_s == mean
    meta = json.loads(render(loaded, loaded.best(), "json"))["meta"]
    assert meta["output_throughput_tok_s"] == mean
    assert meta["gain_over_baseline"] == pytest.approx(gain)
    headline = " ".join(headline_sentences(loaded, loaded.best()))
    assert f"throughput {mean:,.2f} (the mean of 3 runs), {gain:.2f}x the baseline" in headline


def test_the_live_trial_line_quotes_the_crown_by_its_mean(storage_url: str) -> None:
    """Before: each trial's line ended `best X (#N)` with the best single run, while the
    summary below it crowned another config by the mean of its runs."""
    study = build_study(storage_url, "s")
    feasible = [t for t in study.trials if t.user_attrs.get("outcome") == "ok"]
    lucky = max(feasible, key=lambda t: t.values[0])
    crowned = sorted(feasible, key=lambda t: -t.values[0])[1]
    mean = crowned.values[0] * 0.98
    stored = optuna.load_study(study_name="s", storage=storage_url)
    TunerStudyRecord(
        winner=Winner(
            trial=crowned.number, trials=[crowned.number, 90], mean=mean, spread=1.0,
            measurements=2,
        )
    ).write(stored)  # fmt: skip
    lines: list[str] = []
    tally = Tally(n_trials=None, already_done=0, maximize=True)
    progress = PlainProgress(lines.append, tally, metric="output_tok_s")
    progress.on_trial_end(stored.trials[lucky.number], "ok", stored)
    assert lines[-1].endswith(f"; best {mean:,.1f} output_tok_s (#{crowned.number}, mean of 2)")
    # A resumed run's display starts from the same crown.
    resumed = best_so_far(load_study(storage_url, "s"))
    assert resumed is not None
    assert (
        resumed.text("output_tok_s")
        == f"best {mean:,.1f} output_tok_s (#{crowned.number}, mean of 2)"
    )


@pytest.mark.parametrize(("drift", "said"), [(-0.003, True), (0.0001, False)])
def test_a_drift_the_re_measurements_showed_is_said_where_the_crown_is(
    storage_url: str, drift: float, said: bool
) -> None:
    """A GPU that slowed over the night: the summary and `show` say by how much a trial,
    and that configs were compared with it taken out; a drift too small to matter is not
    mentioned."""
    study = build_study(storage_url, "s")
    feasible = [t for t in study.trials if t.user_attrs.get("outcome") == "ok"]
    crowned = max(feasible, key=lambda t: t.values[0])
    TunerStudyRecord(
        winner=Winner(
            trial=crowned.number, trials=[crowned.number, 90], mean=crowned.values[0],
            spread=1.0, measurements=2, drift_per_trial=drift,
        )
    ).write(optuna.load_study(study_name="s", storage=storage_url))  # fmt: skip
    summary = " ".join(summary_lines(load_study(storage_url, "s")))
    _, shown = _show_rows(storage_url)
    sentence = "re-measurements show the output_tok_s drifting -0.30% a trial"
    assert (sentence in summary) is said, summary
    assert (sentence in shown) is said, shown
    assert ("drifting" in summary) is said
