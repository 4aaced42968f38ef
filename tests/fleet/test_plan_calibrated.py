"""A plan corrected by a study measured on one GPU: its predictions for that GPU move
toward what the study measured, and the plan says by how much."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from autotune.sim.model.calibration_profile import CalibrationProfile, save_profile
from autotune.sim.model.speed_constants import SpeedConstants
from tests.e2e.conftest import SAMPLE_WORKLOAD, autotune_argv, tuner_args

GPU, MODEL = "rtx4080s-32g", "qwen3.6-27b-awq"
FITS_SPACE = Path(__file__).parents[1] / "e2e" / "data" / "fits.yaml"
MOVED = re.compile(r"median throughput error ([\d.]+)% uncalibrated -> ([\d.]+)% calibrated")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        autotune_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.timeout(420)
def test_a_study_on_one_gpu_moves_the_plan_toward_its_measurements(tmp_path: Path) -> None:
    # The "real" GPU: the simulator with its bandwidth efficiency at 0.6, unlike the catalog.
    truth = tmp_path / "truth.yaml"
    save_profile(
        CalibrationProfile(
            hardware=GPU, model=MODEL, source="truth",
            constants=SpeedConstants(bandwidth_efficiency=0.6),
        ),
        truth,
    )  # fmt: skip
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    study = _run(
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim", "--hardware", GPU,
        "--model", MODEL, "--space", str(FITS_SPACE), "--storage", storage, "--study", "cal",
        "--sampler", "grid", "--trials", "3", "--concurrency", "4",
        *tuner_args(tmp_path / "settings", {
            "seed": 1, "warm_start": 0, "confirm": 0,
            "simulator": {"time_scale": 200, "calibration": str(truth)},
            "load": {"max_requests": 10},
        }),
        cwd=tmp_path,
    )  # fmt: skip
    assert study.returncode == 0, study.stdout[-2000:] + study.stderr[-2000:]
    planned = _run(
        "plan", str(SAMPLE_WORKLOAD), "--model", MODEL, "--gpu", GPU, "--sessions", "4",
        "--slo", "ttft_p95<=120s", "--study", "cal",
        "--storage", storage, "--out", "out", cwd=tmp_path,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-2000:]
    said = " ".join(planned.stdout.split())
    moved = MOVED.search(said)
    assert moved is not None, said
    print(moved[0])
    before, after = float(moved[1]), float(moved[2])
    assert before > 10 and after < before / 2, said
    record = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert record["candidates"][0]["calibrated"] is True
    assert record["calibration"]["uncalibrated_error"] == pytest.approx(before / 100, abs=0.001)
