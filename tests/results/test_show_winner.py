"""`autotune show` puts the tuner's crowned config first, even below a lucky single run."""

from __future__ import annotations

import optuna
from typer.testing import CliRunner

from autotune.cli import app
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
