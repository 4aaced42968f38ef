"""`autotune run` with a calibration profile (`simulator.calibration`): the simulated server
and the tuner's predictions use the profile, the study stores it, and resuming with another
profile is refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest

from autotune.config.trial_config import TrialConfig
from autotune.replay.load import LoadSpec
from autotune.results.reader import load_study
from autotune.sim.model.calibration_profile import CalibrationProfile, load_profile, save_profile
from autotune.sim.model.speed_constants import SpeedConstants
from autotune.study.setup import RunOptions, prepare_study
from autotune.trial.record import TrialRecord
from tests.e2e.conftest import SAMPLE_WORKLOAD, autotune_argv, autotune_in_process, tuner_args

FITS_SPACE = Path(__file__).with_name("data") / "fits.yaml"
HARDWARE, MODEL = "rtx4080s-32g", "qwen3.6-27b-awq"
SLOW = SpeedConstants(bandwidth_efficiency=0.3, step_overhead_s=6e-3)


def _profile(path: Path, constants: SpeedConstants = SLOW, **fields: object) -> Path:
    fitted_on = {"hardware": HARDWARE, "model": MODEL, "source": "points.json", **fields}
    save_profile(CalibrationProfile(constants=constants, **fitted_on), path)  # type: ignore[arg-type]
    return path


def _args(cwd: Path, study: str, *extra: str, calibration: Path | None = None) -> list[str]:
    simulator = {"time_scale": 50} | ({"calibration": str(calibration)} if calibration else {})
    settings = {"seed": 1, "warm_start": 0, "confirm": 0, "simulator": simulator,
                "load": {"max_requests": 12}}  # fmt: skip
    return [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", HARDWARE, "--model", MODEL, "--space", str(FITS_SPACE),
        "--storage", f"sqlite:///{cwd / 'a.db'}", "--study", study, "--sampler", "grid",
        "--trials", "1", "--concurrency", "4", *tuner_args(cwd / "settings", settings), *extra,
    ]  # fmt: skip


def _run(
    cwd: Path, study: str, *extra: str, calibration: Path | None = None
) -> subprocess.CompletedProcess[str]:
    argv = autotune_argv(*_args(cwd, study, *extra, calibration=calibration))
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_prepare_study_gives_the_profile_to_the_server_and_the_tuner(tmp_path: Path) -> None:
    path = _profile(tmp_path / "slow.yaml")
    options = RunOptions(
        workload=SAMPLE_WORKLOAD, model=MODEL, hardware=HARDWARE, space=FITS_SPACE,
        storage=f"sqlite:///{tmp_path / 'a.db'}", calibration=path,
        load=LoadSpec(max_requests=12),
    )  # fmt: skip
    spec = prepare_study(options)
    digest = load_profile(path).digest()
    assert spec.calibration is not None and spec.calibration.digest() == digest
    assert spec.oracle is not None and spec.oracle.calibration is not None
    assert spec.oracle.calibration.digest() == digest
    argv = spec.engine.argv(TrialConfig(model=MODEL, flags={}), port=8000)
    assert argv[argv.index("--calibration") + 1] == str(path.resolve())
    # The tuner's prediction of a config is the calibrated one: slower than the default's.
    config = TrialConfig(model=MODEL, flags={"kv-cache-memory-bytes": "8G", "max-num-seqs": 4})
    calibrated = spec.oracle.predict(config)
    plain = prepare_study(options.model_copy(update={"calibration": None})).oracle
    assert plain is not None
    uncalibrated = plain.predict(config)
    assert calibrated is not None and uncalibrated is not None
    assert calibrated.expected_error is None  # the test profile has no residuals
    ratio = calibrated.stats.output_throughput_tok_s / uncalibrated.stats.output_throughput_tok_s
    assert ratio < 0.8, ratio


@pytest.mark.timeout(400)
def test_run_with_a_profile_measures_its_speed_stores_it_and_refuses_another(
    tmp_path: Path,
) -> None:
    slow = _profile(tmp_path / "slow.yaml")
    calibrated = _run(tmp_path, "cal", calibration=slow)
    assert calibrated.returncode == 0, calibrated.stdout[-2000:] + calibrated.stderr[-2000:]
    plain = _run(tmp_path, "plain")
    assert plain.returncode == 0, plain.stdout[-2000:] + plain.stderr[-2000:]
    storage = f"sqlite:///{tmp_path / 'a.db'}"
    study = optuna.load_study(study_name="cal", storage=storage)
    stored = study.user_attrs["calibration"]
    assert stored["digest"] == load_profile(slow).digest()
    assert (stored["hardware"], stored["model"], stored["source"]) == (
        HARDWARE,
        MODEL,
        "points.json",
    )
    assert stored["path"] == str(slow)
    assert load_study(storage, "plain").info.calibration is None
    assert load_study(storage, "cal").info.calibration == stored
    (trial,) = study.trials
    argv = TrialRecord.read(trial.user_attrs).argv
    assert argv is not None
    assert argv[argv.index("--calibration") + 1] == str(slow.resolve())
    (plain_trial,) = optuna.load_study(study_name="plain", storage=storage).trials
    assert plain_trial.params == trial.params
    # The simulated server ran the profile's (slower) constants.
    assert trial.values[0] < 0.8 * plain_trial.values[0], (trial.values, plain_trial.values)

    other = _profile(tmp_path / "other.yaml", SpeedConstants(bandwidth_efficiency=0.5))
    for profile in (other, None):
        # Refused before anything starts: the CLI app in-process, no interpreter start.
        refused = autotune_in_process(*_args(tmp_path, "cal", "--trials", "2", calibration=profile))
        assert refused.returncode == 2, refused.stdout[-2000:]
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert f"study 'cal' was run with calibration profile {slow}" in lines[0]
        assert "resume with the same simulator.calibration setting" in lines[0]
    assert len(optuna.load_study(study_name="cal", storage=storage).trials) == 1
