"""The trial record: one writer, one reader, old studies still read, the doc table is the model."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.distributions import json_to_distribution

from autotune.errors import InputError
from autotune.results.reader import load_study
from autotune.trial.record import TrialRecord, attrs_table
from autotune.vocabulary import FailureClass, Outcome

DATA = Path(__file__).parent / "data"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _restore(storage_url: str, dump: dict) -> optuna.Study:
    """A study with exactly the attrs a previous version stored (dumped from its SQLite)."""
    study = optuna.create_study(
        study_name=dump["study_name"], storage=storage_url, directions=dump["directions"]
    )
    for key, value in dump["user_attrs"].items():
        study.set_user_attr(key, value)
    for trial in dump["trials"]:
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState[trial["state"]],
                values=trial["values"],
                params=trial["params"],
                distributions={
                    name: json_to_distribution(json.dumps(spec))
                    for name, spec in trial["distributions"].items()
                },
                user_attrs=trial["user_attrs"],
                constraints=trial["constraints"],
            )
        )
    return study


def test_study_written_before_the_record_reads_and_rewrites_unchanged(storage_url: str) -> None:
    dump = json.loads((DATA / "study-before-trial-record.json").read_text())
    _restore(storage_url, dump)
    loaded = load_study(storage_url)
    assert [row.outcome for row in loaded.trials] == [
        Outcome.OK,
        Outcome.OK,
        Outcome.PREDICTED_OOM,
        Outcome.OK,
    ]
    for row, trial in zip(loaded.trials, dump["trials"], strict=True):
        old = trial["user_attrs"]
        assert row.measured is old["measured"]
        assert row.is_baseline is old["is_baseline"]
        assert row.retry_of is None and row.error is None  # keys that version never wrote
        # what the reader types, the writer stores back key for key
        rewritten = TrialRecord.read(old).attrs()
        assert {key: rewritten[key] for key in old} == old
    assert loaded.best().number == 1
    assert loaded.trials[2].argv is None and loaded.trials[2].memory is not None


def test_writer_and_reader_round_trip_through_optuna(storage_url: str) -> None:
    study = optuna.create_study(storage=storage_url)
    trial = study.ask()
    TrialRecord(outcome=FailureClass.ENGINE_DEAD, argv=["vllm", "serve", "m"], wall_s=2.5).write(
        trial
    )
    study.tell(trial, 1.0)
    stored = study.trials[0].user_attrs
    assert stored["outcome"] == "engine-dead" and stored["measured"] is False
    assert "replay" not in stored  # only what the writer set is stored
    record = TrialRecord.read(stored)
    assert record.outcome is FailureClass.ENGINE_DEAD
    assert record.argv == ("vllm", "serve", "m")
    assert not record.measured


def test_measured_needs_a_measured_outcome_and_a_replay() -> None:
    replay = json.loads((DATA / "study-before-trial-record.json").read_text())["trials"][0][
        "user_attrs"
    ]["replay"]
    assert TrialRecord.read({"outcome": "slo-violated", "replay": replay}).measured
    assert not TrialRecord.read({"outcome": "ok"}).measured
    assert not TrialRecord.read({"outcome": "trial-timeout", "replay": replay}).measured
    assert not TrialRecord.read({"replay": replay, "measured": True}).measured  # derived


def test_unknown_outcome_names_the_field() -> None:
    with pytest.raises(InputError, match=r"trial 3 user attr outcome"):
        TrialRecord.read({"outcome": "exploded"}, where="trial 3 user attr")


def test_architecture_doc_lists_the_records_fields() -> None:
    assert attrs_table() in ARCHITECTURE.read_text(), (
        "docs/architecture.md's trial attrs table differs from TrialRecord; paste:\n"
        + attrs_table()
    )
