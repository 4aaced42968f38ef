"""`autotune run` on bad input: one clear line naming what and where, exit 2, studies untouched."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune.cli import app
from tests.e2e.conftest import tuner_args

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"


def invoke(tmp_path: Path, *args: str, storage: str | None = None) -> tuple[int, str]:
    storage = storage or f"sqlite:///{tmp_path / 'a.db'}"
    base = ["run", "--workload", str(WORKLOAD), "--engine", "sim", "--hardware", "rtx4080s-32g",
            "--model", "qwen3.6-27b-awq", "--storage", storage, "--trials", "1"]  # fmt: skip
    result = CliRunner().invoke(app, [*base, *args])
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--objective", "speed"], "--objective: unknown objective 'speed'"),
        (["--slo", "ttft<2s"], "--slo 'ttft<2s'"),
        (["--sampler", "annealing"], "--sampler: unknown sampler 'annealing'"),
        (["--timeout", "soon"], "--timeout 'soon'"),
        (["--hardware", "rtx9999"], "rtx9999"),
    ],
)
def test_bad_options(tmp_path: Path, args: list[str], expected: str) -> None:
    code, err = invoke(tmp_path, *args)
    assert code == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_space_field_names_file_and_line(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("name: s\nparameters:\n  a:\n    type: int\n    low: 1\n    high: 4\n"
                     "    flg: max-num-seqs\n")  # fmt: skip
    code, err = invoke(tmp_path, "--space", str(space))
    assert code == 2
    assert f"{space}:7: parameters.a.int.flg" in err


def test_missing_workload(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--workload", str(tmp_path / "nope.jsonl"),
                                      "--model", "qwen3.6-27b-awq", "--hardware", "rtx4080s-32g",
                                      "--storage", f"sqlite:///{tmp_path / 'a.db'}"])  # fmt: skip
    assert result.exit_code == 2
    assert "nope.jsonl" in result.stderr


def test_unreachable_storage(tmp_path: Path) -> None:
    code, err = invoke(tmp_path, storage="sqlite:////proc/autotune/a.db")
    assert code == 2
    assert "--storage sqlite:////proc/autotune/a.db" in err


def test_resuming_with_another_workload_is_refused_and_the_study_untouched(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'a.db'}"
    study = optuna.create_study(study_name="mine", storage=storage, direction="maximize")
    study.set_user_attr("workload_digest", "an-older-workload")
    study.add_trial(optuna.trial.create_trial(value=1.0, params={}, distributions={}))
    code, err = invoke(tmp_path, "--study", "mine", storage=storage)
    assert code == 2
    assert "study 'mine' was created with another workload digest" in err
    after = optuna.load_study(study_name="mine", storage=storage)
    assert len(after.trials) == 1
    assert after.user_attrs == {"workload_digest": "an-older-workload"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("constants:\n  bandwidth_efficiency: fast\n", "constants.bandwidth_efficiency:"),
        ("hardware: h200-141g\n", "was fitted for hardware 'h200-141g', not 'rtx4080s-32g'"),
        ("constants: [1, 2\n", ":2: not YAML"),
    ],
)
def test_bad_calibration_profile_names_file_and_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(text)
    code, err = invoke(
        tmp_path, *tuner_args(tmp_path, {"simulator": {"calibration": str(profile)}})
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert str(profile) in err and expected in err
    assert not (tmp_path / "a.db").exists() or not optuna.get_all_study_names(
        f"sqlite:///{tmp_path / 'a.db'}"
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--trials", "0"], "error: --trials 0: Input should be greater than or equal to 1"),
        (["--concurrency", "0"], "error: --concurrency 0: Input should be greater than"),
        (["--max-error-rate", "2"], "error: --max-error-rate 2.0: Input should be less than"),
    ],
)
def test_a_refused_value_names_its_option_as_typed(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    """Before: `error: trials: Input should be ...`, the model's field, not the option."""
    code, err = invoke(tmp_path, *args)
    assert code == 2
    assert err.strip() == expected or err.startswith(expected), err


def test_invalid_json_names_file_line_and_column(tmp_path: Path) -> None:
    """Before: `bad.jsonl:2: (line): invalid JSON`, a field named `(line)`."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(WORKLOAD.read_text().splitlines()[0] + "\n{not json\n")
    result = CliRunner().invoke(app, ["run", "--workload", str(bad), "--engine", "sim",
                                      "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq",
                                      "--storage", f"sqlite:///{tmp_path / 'a.db'}"])  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {bad}:2: invalid JSON at column 2: Expecting property name enclosed in "
        "double quotes"
    )


def test_a_storage_under_a_regular_file_says_so(tmp_path: Path) -> None:
    """Before: `cannot open: [Errno 17] File exists: '.../afile'`."""
    (tmp_path / "afile").write_text("")
    code, err = invoke(tmp_path, storage=f"sqlite:///{tmp_path / 'afile' / 'db' / 'a.db'}")
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert f"cannot create the folder {tmp_path / 'afile' / 'db'}: " in err
    assert f"{tmp_path / 'afile'} is a file, not a folder" in err
    assert "Errno" not in err
