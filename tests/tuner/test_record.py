"""The tuner's study attrs: one writer and reader, and the table docs/architecture.md shows."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.errors import InputError
from autotune.tuner.record import TunerStudyRecord, Winner, tuner_attrs_table

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_the_winner_round_trips_through_a_study_and_a_bad_one_names_its_field() -> None:
    study = optuna.create_study()
    winner = Winner(trial=3, trials=[3, 9], mean=80.5, spread=1.2, measurements=2)
    TunerStudyRecord(winner=winner).write(study)
    assert set(study.user_attrs) == {"winner"}  # the unset warm start is not written
    record = TunerStudyRecord.read(study.user_attrs)
    assert record.winner == winner and record.warm_start is None
    with pytest.raises(InputError, match=r"winner\.mean"):
        TunerStudyRecord.read({"winner": {**winner.model_dump(), "mean": "fast"}})


def test_architecture_doc_lists_the_tuners_study_attrs() -> None:
    assert tuner_attrs_table() in ARCHITECTURE.read_text(), (
        "docs/architecture.md's tuner attrs table differs from the models; paste:\n"
        + tuner_attrs_table()
    )
