"""Per-GPU speed constants fitted to published runs, for a held-out check by source.

``fit_gpu_constants`` fits, for each GPU, the constants a published ``vllm bench serve``
run can see (``FITTED``) to that GPU's points: bounded least squares on the log errors of
throughput, TPOT and TTFT (calibration/published_table.py's figures), with the pull
towards the catalog's constants that ``calibration/fit.py`` uses (a Gaussian prior on each
constant's log, ``PRIOR_WEIGHT``). ``SPLITS`` are the two halves of the sources: fitted
on one half, the constants are judged on the other, so a publication's own quirks (its
host, its client, its vLLM build) cannot make its own points look right.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from scipy.optimize import least_squares

from autotune.calibration.published import PublishedPoint
from autotune.calibration.published_predict import NotPredicted, predict_point
from autotune.calibration.published_table import FIGURES, PointResult
from autotune.sim.model.speed_constants import BOUNDS, DEFAULT_CONSTANTS, SpeedConstants

FITTED = ("bandwidth_efficiency", "compute_efficiency", "step_overhead_s", "host_per_output_s")
TIED = {"prefill_compute_efficiency": "compute_efficiency"}  # moves by the same factor
FIT_START = {"host_per_output_s": 20e-6}  # a zero default is started here (log scale)
PRIOR_WEIGHT = 0.17  # about +-30% on each constant (calibration/fit.py, PRIOR_WEIGHTS)
DIFF_STEP = 0.1
MAX_EVALUATIONS = 6  # least-squares iterations; each predicts the GPU's points per constant
FIT_WORKERS = 2  # GPUs fitted at once, one process each
# Requests of a run at a set rate predicted while fitting: its steady state, in a fraction of
# the time (the published figures are judged on every request).
FIT_MAX_OPEN_LOOP = 1000
MISSED = math.log(10.0)  # a point the constants make fail: a factor-10 miss

# The sources (PublishedPoint.source, by prefix) in each half: the large sweeps on one
# side, the rest on the other, so each GPU with points in both halves is judged on
# publications its constants never saw.
HALF_A = (
    "github.com/gpustack",
    "github.com/IOG-Foundation",
    "github.com/vllm-project/vllm/issues/16515",
    "github.com/crusoecloud",
)
SPLITS = {"A": (HALF_A, ("the other sources",)), "B": (("the other sources",), HALF_A)}


def in_half(point: PublishedPoint, half: Sequence[str]) -> bool:
    """Whether ``point``'s source is in ``half`` ("the other sources": not in HALF_A)."""
    if half == ("the other sources",):
        return not any(point.source.startswith(prefix) for prefix in HALF_A)
    return any(point.source.startswith(prefix) for prefix in half)


def split_points(
    points: Sequence[PublishedPoint], fit_half: Sequence[str], held_half: Sequence[str]
) -> tuple[list[PublishedPoint], list[PublishedPoint]]:
    """The points to fit on and the points held out."""
    return (
        [point for point in points if in_half(point, fit_half)],
        [point for point in points if in_half(point, held_half)],
    )


def _log_errors(points: Sequence[PublishedPoint], constants: SpeedConstants) -> list[float]:
    out: list[float] = []
    for point in points:
        try:
            predicted = predict_point(point, constants, max_open_loop=FIT_MAX_OPEN_LOOP)
            result = PointResult(point, predicted)
        except NotPredicted:
            out += [MISSED] * len(FIGURES)
            continue
        for figure in FIGURES:
            error = result.error(figure)
            if error is not None:
                out.append(math.log(max(error + 1, 1e-3)))
    return out


def fit_constants(
    points: Sequence[PublishedPoint], start: SpeedConstants = DEFAULT_CONSTANTS
) -> SpeedConstants:
    """The constants (``FITTED``) that best predict ``points`` under the prior."""
    seeded = start.model_copy(
        update={name: value for name, value in FIT_START.items() if not getattr(start, name)}
    )
    scale = np.array([getattr(seeded, name) for name in FITTED])
    lower = np.log([max(BOUNDS[name][0], 1e-7) for name in FITTED] / scale)
    upper = np.log([BOUNDS[name][1] for name in FITTED] / scale)

    def constants(x: np.ndarray) -> SpeedConstants:
        values = {name: float(math.exp(v) * s) for name, v, s in zip(FITTED, x, scale, strict=True)}
        for name, leader in TIED.items():
            factor = values[leader] / getattr(seeded, leader)
            values[name] = min(getattr(seeded, name) * factor, BOUNDS[name][1])
        return seeded.model_copy(update=values)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate([_log_errors(points, constants(x)), PRIOR_WEIGHT * x])

    x0 = np.clip(np.zeros(len(FITTED)), lower, upper)
    result = least_squares(
        residuals, x0, bounds=(lower, upper), diff_step=DIFF_STEP, max_nfev=MAX_EVALUATIONS
    )
    return constants(result.x)


def fit_gpu_constants(
    points: Sequence[PublishedPoint],
    catalog: Mapping[str, PointResult],
    only: Collection[str] | None = None,
) -> dict[str, SpeedConstants]:
    """Constants per GPU fitted on its predictable ``points`` (``catalog``: each point's
    result at the catalog's constants, to leave out what the simulator cannot predict;
    ``only``: the GPUs to fit, None: all)."""
    gpus: dict[str, list[PublishedPoint]] = {}
    for point in points:
        if only is not None and point.gpu not in only:
            continue
        if catalog[point.id].predicted is not None:
            gpus.setdefault(point.gpu, []).append(point)
    with ProcessPoolExecutor(max_workers=FIT_WORKERS) as pool:
        fitted = pool.map(fit_constants, gpus.values())
        return dict(zip(gpus, fitted, strict=True))
