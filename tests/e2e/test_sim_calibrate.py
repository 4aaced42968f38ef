"""`autotune sim calibrate` through the real CLI: points files, studies, and using the profile."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.calibration.points import save_points
from tests.e2e.conftest import SAMPLE_WORKLOAD, autotune_argv, tuner_args
from tests.sim.test_calibrate import HARDWARE, MODEL, TRUTH, measured

FITS_SPACE = Path(__file__).with_name("data") / "fits.yaml"
SWEEP_FIELDS = {
    "concurrency", "mtp", "output_tokens_per_s", "mean_latency_s", "duration_s", "mean_ttft_s",
    "mean_tpot_s", "completed", "mean_acceptance_length", "preemptions", "kv_cache_tokens",
    "failure",
}  # fmt: skip


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        autotune_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _predict(cwd: Path, concurrency: int, mtp: int, *extra: str) -> dict[str, object]:
    done = _run(
        "sim", "predict", "--hardware", HARDWARE, "--model", MODEL,
        "--concurrency", str(concurrency), "--mtp", str(mtp),
        "--prompt-tokens", "128", "--output-tokens", "64", "--requests-per-client", "2",
        "--json", *extra, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    return row


@pytest.mark.timeout(300)
def test_calibrate_from_points_then_predict_held_out_cells(tmp_path: Path) -> None:
    points = measured(TRUTH, [(1, 0), (8, 0), (2, 3), (8, 3), (4, 2)])
    fitted_on, held_out = points[:4], points[4]
    save_points(fitted_on, tmp_path / "points.json")
    done = _run(
        "sim", "calibrate", "--hardware", HARDWARE, "--model", MODEL,
        "--points", "points.json", "--out", "profile.yaml", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "expected error" in done.stdout
    profile = yaml.safe_load((tmp_path / "profile.yaml").read_text())
    assert profile["hardware"] == HARDWARE and profile["model"] == MODEL
    assert profile["source"] == "points.json"
    assert len(profile["points"]) == 4
    assert profile["expected_error_basis"] == "cross-validation"

    raw = _predict(tmp_path, held_out.concurrency, held_out.mtp)
    calibrated = _predict(
        tmp_path, held_out.concurrency, held_out.mtp, "--calibration", "profile.yaml"
    )
    assert set(raw) >= SWEEP_FIELDS and set(calibrated) >= SWEEP_FIELDS
    assert raw["expected_error"] is None
    assert calibrated["expected_error"] == pytest.approx(profile["expected_error"])
    truth = held_out.output_tokens_per_s
    raw_error = abs(raw["output_tokens_per_s"] / truth - 1)  # type: ignore[operator]
    calibrated_error = abs(calibrated["output_tokens_per_s"] / truth - 1)  # type: ignore[operator]
    assert calibrated_error < raw_error / 2, (calibrated_error, raw_error)


def test_malformed_points_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    entry = {"concurrency": 1, "mtp": 0, "prompt_tokens": 8, "output_tokens": 8,
             "output_tokens_per_s": 10.0, "mean_latency_s": 1.0}  # fmt: skip
    broken = dict(entry)
    del broken["mean_latency_s"]
    (tmp_path / "pts.json").write_text(json.dumps([entry, broken]))
    done = _run(
        "sim", "calibrate", "--hardware", HARDWARE, "--model", MODEL,
        "--points", "pts.json", "--out", "profile.yaml", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pts.json:1:mean_latency_s: Field required" in lines[0]
    assert not (tmp_path / "profile.yaml").exists()


@pytest.mark.timeout(420)
def test_calibrate_from_a_sim_study(tmp_path: Path) -> None:
    db = tmp_path / "autotune.db"
    storage = f"sqlite:///{db}"
    study = _run(
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", HARDWARE, "--model", MODEL, "--space", str(FITS_SPACE),
        "--storage", storage, "--study", "cal", "--sampler", "grid",
        "--trials", "3", "--concurrency", "4",
        *tuner_args(tmp_path / "settings", {
            "seed": 1, "warm_start": 0, "confirm": 0,
            "simulator": {"time_scale": 200}, "load": {"max_requests": 10},
        }),
        cwd=tmp_path,
    )  # fmt: skip
    assert study.returncode == 0, study.stdout[-2000:] + study.stderr[-2000:]
    done = _run(
        "sim", "calibrate", "--from-study", "cal", "--storage", storage,
        "--out", "profile.yaml", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    profile = yaml.safe_load((tmp_path / "profile.yaml").read_text())
    assert profile["source"] == "study cal"
    assert profile["hardware"] == HARDWARE and profile["model"] == MODEL
    assert profile["engine_version"]
    stored = optuna.load_study(study_name="cal", storage=storage).user_attrs
    assert profile["workload_digest"] == stored["workload"]["digest"]
    assert profile["engine_version"] == stored["engine_version"]
    assert len(profile["points"]) == 3
    for point in profile["points"]:
        assert point["label"].startswith("trial ")
        # The simulator's startup report and its memory model agree to the token.
        assert point["measured_kv_cache_tokens"] == point["model_kv_cache_tokens"]
        assert point["calibrated_tok_s"] > 0
    # The study's engine is the catalog's simulator: its trials are no evidence against
    # the catalog, so nothing moves, and the command says why.
    assert profile["catalog_p_value"] >= 0.05 and profile["fitted"] == []
    assert "the catalog kept: its errors on these points are within measurement noise" in (
        " ".join(done.stdout.split())
    )
