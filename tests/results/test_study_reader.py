from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.errors import InputError, StorageError
from autotune.results.reader import dashboard_argv, load_study, resolve_study_name

from .conftest import build_study


def test_typed_rows_follow_the_attrs_contract(study_url: str) -> None:
    loaded = load_study(study_url)
    assert loaded.name == "qwen-4080"
    assert loaded.info.gpu_name.startswith("NVIDIA GeForce RTX 4080")
    assert loaded.info.slos == ("ttft_p95<=12s",)
    outcomes = {row.outcome for row in loaded.trials}
    assert {"ok", "slo-violated", "kv-does-not-fit", "engine-dead"} <= outcomes
    oom = [row for row in loaded.trials if row.is_oom]
    assert [row.number for row in oom] == [4, 5, 11]
    assert all(not row.feasible and not row.measured for row in oom)
    crash = loaded.trial(9)
    assert crash.failure is not None and crash.failure.failure_class == "engine-dead"
    assert crash.constraints["crash"] == 1.0


def test_best_is_the_best_feasible_trial_not_a_placeholder(study_url: str) -> None:
    loaded = load_study(study_url)
    best = loaded.best()
    assert best.number == 7
    assert best.throughput_tok_s == pytest.approx(608.0)
    baseline = loaded.baseline()
    assert baseline is not None and baseline.number == 0
    assert loaded.gain_over_baseline(best) == pytest.approx(608.0 / baseline.throughput_tok_s)


def test_multi_objective_best_is_a_pareto_point(pareto_url: str) -> None:
    loaded = load_study(pareto_url)
    assert loaded.multi_objective
    pareto = {row.number for row in loaded.pareto()}
    assert loaded.best().number in pareto
    assert all(loaded.trial(n).feasible for n in pareto)


def test_default_study_is_the_most_recent(storage_url: str) -> None:
    build_study(storage_url, "older")
    build_study(storage_url, "newer")
    assert resolve_study_name(storage_url, None) == "newer"
    with pytest.raises(InputError, match=r"'missing': not in .* \(has: older, newer\)"):
        resolve_study_name(storage_url, "missing")


def test_missing_sqlite_file_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "nope.db"
    with pytest.raises(StorageError, match="does not exist"):
        load_study(f"sqlite:///{path}")
    assert not path.exists()


def test_unknown_trial_number_names_the_range(study_url: str) -> None:
    with pytest.raises(InputError, match=r"no trial 99 \(trials are 0\.\.12\)"):
        load_study(study_url).trial(99)


def test_bad_stored_attr_names_study_trial_and_field(storage_url: str) -> None:
    study = optuna.create_study(study_name="bad", storage=storage_url)
    study.add_trial(
        optuna.trial.create_trial(value=1.0, user_attrs={"replay": {"duration_s": "long"}})
    )
    with pytest.raises(InputError, match=r"study 'bad' trial 0 user attr replay\.duration_s"):
        load_study(storage_url)


def test_study_loads_through_optunas_public_api_alone(study_url: str) -> None:
    """What optuna-dashboard relies on: load_study, trials, attrs, constraints."""
    study = optuna.load_study(study_name="qwen-4080", storage=study_url)
    assert study.metric_names == ["throughput"]
    assert study.user_attrs["engine"] == "sim"
    assert study.best_trial.number == 7
    assert study.trials[4].constraints["oom"] > 0
    assert study.trials[0].user_attrs["is_baseline"] is True


def test_dashboard_command_points_at_storage_and_artifacts(study_url: str) -> None:
    argv = dashboard_argv(study_url)
    assert argv[0].endswith("optuna-dashboard")
    beside_db = Path(study_url.removeprefix("sqlite:///")).parent / "artifacts"
    assert argv[1:] == [
        study_url,
        "--artifact-dir",
        str(beside_db),
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
    ]
    argv = dashboard_argv(study_url, artifact_dir=Path("elsewhere"), port=9000)
    assert argv[3] == "elsewhere" and argv[-1] == "9000"
