"""Fit the speed model's constants to measurements: ``autotune sim calibrate``.

Each measurement is a ``Target``: a configuration, the workload and load it
ran under, and what it measured (output tok/s, mean latency, optionally
vLLM's mean acceptance length). The fit moves the constants that the targets
can identify (efficiencies and fixed costs always; draft cost and
per-position acceptance when a target ran MTP) within ``BOUNDS``, minimising
the log errors of the in-process prediction (scipy's bounded least squares),
with a pull towards the catalog's constants: a Gaussian prior on each fitted
constant's log, so the fit is a MAP estimate. Acceptance is fitted as
conditional rates (position i given i-1 accepted), so the per-position rates
can only fall.

Whether to move the catalog at all is first a test of the evidence
(``catalog_p_value``): if measurement noise alone (``NOISE`` per figure) would
leave the catalog's errors on the points as large as they are more often than
``EVIDENCE``, the points cannot tell a better constant from noise and the catalog
is kept. Cross-validation alone did not suffice: on 4 points it is itself noisy,
and a fit that won it by chance made the held-out cells up to 1.7x worse
(docs/benchmarks.md, "Calibration"). Otherwise how strong the prior is, or again
whether to keep the catalog, is chosen by cross-validation (``choose_prior``):
each prior width in ``PRIOR_WEIGHTS`` is fitted without each fold and judged on it,
beside the uncalibrated catalog judged on every point; the lowest held-out error
wins, the catalog on a tie.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import chi2

from autotune.calibration.points import MeasuredPoint
from autotune.catalog.models import get_model
from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.sim.model.calibration_profile import CalibrationProfile, FittedPoint
from autotune.sim.model.config import SimConfig
from autotune.sim.model.memory import plan_memory
from autotune.sim.model.scheduler import ACCEPTANCE_DECAY
from autotune.sim.model.speed_constants import (
    ACCEPTANCE_BOUNDS,
    BOUNDS,
    DEFAULT_CONSTANTS,
    SpeedConstants,
)
from autotune.sim.virtual.predict import predict
from autotune.sim.virtual.sweep import baseline_config, closed_loop
from autotune.workload.plan import WorkloadPlan

ALWAYS_FITTED = (
    "bandwidth_efficiency",
    "compute_efficiency",
    "prefill_compute_efficiency",
    "step_overhead_s",
    "per_seq_overhead_s",
    "request_overhead_s",
    "host_per_output_s",
)
MTP_FITTED = ("draft_pass_overhead_s",)
# The prior: a residual of weight x log(constant / catalog's) beside each point's log
# errors, i.e. measurement noise / prior width, both in log units. With a run's noise of
# about 5%: 0.03 is a width of about +-170% (the points decide), 0.17 about +-30% (how far
# the catalog's constants are off between GPUs of a family), 1.0 about +-5%.
PRIOR_WEIGHTS = (0.03, 0.17, 1.0)
PRIOR_WEIGHT = 0.17  # without cross-validation (fewer than 3 points, or asked)
MIN_SCALE = 1e-7  # a constant's smallest fitted value (its log must exist)
# Where the fit starts a constant that is 0 by default (scalars are fitted on a log scale).
FIT_START = {"request_overhead_s": 10e-3, "host_per_output_s": 0.5e-3}
FAILED_RESIDUAL = math.log(10.0)  # a measured point the model says cannot run
DIFF_STEP = 0.1  # finite-difference step: 10% on a log scale; acceptance draws are a staircase
MAX_EVALUATIONS = 40  # least-squares iterations (each costs one prediction per parameter)
SENSITIVITY = 0.05  # fit a constant only if halving or doubling it moves a prediction by 5%
CV_FOLDS = 5  # cross-validation folds for the expected error (leave-one-out below this)
# The catalog is tested against the points with this run-to-run noise of one measured
# figure (log scale; the bench's truths measure with 3%, repeated real runs differ by a
# few percent), and moved only when its errors are less likely than EVIDENCE under it.
NOISE = 0.04
EVIDENCE = 0.05


@dataclass(frozen=True)
class Target:
    """One measurement to fit: what ran, under what load, and what it measured."""

    label: str
    config: SimConfig
    plan: WorkloadPlan
    load: LoadSpec
    tok_s: float
    latency_s: float
    acceptance_length: float | None = None
    kv_cache_tokens: int | None = None  # what the startup log reported, when known


def point_target(hardware: str, model: str, point: MeasuredPoint) -> Target:
    """A closed-loop point as a target: the hardware's baseline flags plus the point's."""
    config = baseline_config(
        hardware,
        model,
        num_speculative_tokens=point.mtp,
        kv_cache_dtype=point.kv_cache_dtype,
        kv_cache_memory_bytes=point.kv_cache_memory_bytes,
        max_num_seqs=point.max_num_seqs,
        max_num_batched_tokens=point.max_num_batched_tokens,
        max_model_len=point.max_model_len,
        enforce_eager=point.enforce_eager,
    )
    plan, load = closed_loop(
        point.concurrency,
        requests_per_client=point.requests_per_client,
        prompt_tokens=point.prompt_tokens,
        output_tokens=point.output_tokens,
    )
    return Target(
        label=point.label,
        config=config,
        plan=plan,
        load=load,
        tok_s=point.output_tokens_per_s,
        latency_s=point.mean_latency_s,
        acceptance_length=point.mean_acceptance_length,
    )


def predicted(target: Target, constants: SpeedConstants) -> tuple[float, float] | None:
    """Output tok/s and mean latency the model predicts for ``target``; None if it fails."""
    profile = CalibrationProfile(constants=constants)
    prediction = predict(target.config, target.plan, target.load, calibration=profile)
    stats = prediction.stats
    if prediction.failure is not None or not stats.completed or stats.e2e.mean is None:
        return None
    return stats.output_throughput_tok_s, stats.e2e.mean


def _unconditional(conditional: Sequence[float]) -> tuple[float, ...]:
    rates, product = [], 1.0
    for rate in conditional:
        product *= float(rate)
        rates.append(product)
    return tuple(rates)


class _Space:
    """The fitted constants as a vector: log(value / start) per scalar, then acceptance."""

    def __init__(self, start: SpeedConstants, scalars: Sequence[str], positions: int, model: str):
        self.start, self.scalars, self.positions = start, list(scalars), positions
        rates = list(start.mtp_acceptance or get_model(model).default_mtp_acceptance)
        while len(rates) < positions:
            rates.append((rates[-1] if rates else 0.5) * ACCEPTANCE_DECAY)
        low, high = ACCEPTANCE_BOUNDS
        previous, conditional = 1.0, []
        for rate in rates[:positions]:
            conditional.append(min(high, max(low, rate / previous if previous else low)))
            previous = rate
        seeded = _seeded(start)  # the fit's starting values; untouched constants keep start's
        self.scale = np.array([getattr(seeded, name) or MIN_SCALE for name in self.scalars])
        lows = [max(BOUNDS[name][0], MIN_SCALE) for name in self.scalars]
        highs = [BOUNDS[name][1] for name in self.scalars]
        self.lower = np.concatenate([np.log(lows / self.scale), [low] * positions])
        self.upper = np.concatenate([np.log(highs / self.scale), [high] * positions])
        x0 = np.concatenate([np.zeros(len(self.scalars)), conditional])
        self.x0 = np.clip(x0, self.lower, self.upper)

    def constants(self, x: np.ndarray) -> SpeedConstants:
        n = len(self.scalars)
        values: dict[str, object] = {
            name: float(math.exp(value) * scale)
            for name, value, scale in zip(self.scalars, x[:n], self.scale, strict=True)
        }
        if self.positions:
            values["mtp_acceptance"] = _unconditional(x[n:])
        return self.start.model_copy(update=values)

    def prior(self, x: np.ndarray, weight: float) -> np.ndarray:
        return weight * (x - self.x0)


def _residuals(targets: Sequence[Target], constants: SpeedConstants) -> list[float]:
    out: list[float] = []
    for target in targets:
        figures = predicted(target, constants)
        if figures is None:
            out += [FAILED_RESIDUAL, FAILED_RESIDUAL]
        else:
            out += [math.log(figures[0] / target.tok_s), math.log(figures[1] / target.latency_s)]
        k = target.config.num_speculative_tokens
        if target.acceptance_length is not None and k and constants.mtp_acceptance:
            length = 1 + sum(constants.mtp_acceptance[:k])
            out.append(math.log(length / target.acceptance_length))
    return out


def _seeded(start: SpeedConstants) -> SpeedConstants:
    """``start`` with each zero constant the fit may move set to its FIT_START value."""
    return start.model_copy(
        update={name: value for name, value in FIT_START.items() if not getattr(start, name)}
    )


def _sensitive(targets: Sequence[Target], start: SpeedConstants, name: str) -> bool:
    """Whether halving or doubling ``name`` changes some prediction by SENSITIVITY."""
    base = [predicted(target, start) for target in targets]
    low, high = BOUNDS[name]
    for factor in (0.5, 2.0):
        moved = start.model_copy(update={name: min(high, max(low, getattr(start, name) * factor))})
        for target, before in zip(targets, base, strict=True):
            after = predicted(target, moved)
            if before is None or after is None:
                return True
            if any(abs(math.log(a / b)) > SENSITIVITY for a, b in zip(after, before, strict=True)):
                return True
    return False


def fitted_names(
    targets: Sequence[Target],
    free: Sequence[str] | None = None,
    start: SpeedConstants = DEFAULT_CONSTANTS,
) -> tuple[list[str], int]:
    """The scalar constants to fit, and how many acceptance positions.

    ``free``: names from ``BOUNDS`` (and ``mtp_acceptance``); None: those of the
    candidates (efficiencies and fixed costs; draft cost when a target ran MTP)
    that move some prediction by more than SENSITIVITY when halved or doubled
    (on a tiny model the roofline terms do not), and acceptance when a target
    ran MTP.
    """
    positions = max(target.config.num_speculative_tokens for target in targets)
    if free is None:
        candidates = [*ALWAYS_FITTED, *(MTP_FITTED if positions else ())]
        seeded = _seeded(start)
        return [name for name in candidates if _sensitive(targets, seeded, name)], positions
    unknown = [name for name in free if name not in BOUNDS and name != "mtp_acceptance"]
    if unknown:
        raise InputError(
            f"cannot fit {unknown}: fittable constants are {[*BOUNDS, 'mtp_acceptance']}"
        )
    scalars = [name for name in free if name in BOUNDS]
    return scalars, positions if "mtp_acceptance" in free else 0


def fit_constants(
    targets: Sequence[Target],
    *,
    start: SpeedConstants = DEFAULT_CONSTANTS,
    free: Sequence[str] | None = None,
    max_evaluations: int = MAX_EVALUATIONS,
    prior_weight: float = PRIOR_WEIGHT,
) -> SpeedConstants:
    """The constants that best predict ``targets`` under the prior (``PRIOR_WEIGHTS``),
    each within its bounds."""
    scalars, positions = fitted_names(targets, free, start)
    space = _Space(start, scalars, positions, targets[0].config.model)

    def fun(x: np.ndarray) -> np.ndarray:
        residuals = _residuals(targets, space.constants(x))
        return np.concatenate([residuals, space.prior(x, prior_weight)])

    result = least_squares(
        fun,
        space.x0,
        bounds=(space.lower, space.upper),
        diff_step=DIFF_STEP,
        max_nfev=max_evaluations,
        x_scale=1.0,
    )
    return space.constants(result.x)


def _folds(count: int) -> list[list[int]]:
    folds = min(count, CV_FOLDS)
    return [list(range(index, count, folds)) for index in range(folds)]


def _abs_errors(
    targets: Sequence[Target], figures: Sequence[tuple[float, float] | None]
) -> list[float]:
    """Relative errors of ``figures`` (tok/s and latency) against each target; a failed
    prediction counts as a factor-10 miss."""
    errors: list[float] = []
    for target, figure in zip(targets, figures, strict=True):
        if figure is None:
            errors += [9.0, 9.0]
        else:
            errors += [abs(figure[0] / target.tok_s - 1), abs(figure[1] / target.latency_s - 1)]
    return errors


@dataclass(frozen=True)
class PriorChoice:
    """What the noise test or cross-validation chose: a prior weight, or None (the catalog
    kept), with the held-out median error of each candidate tried (key "catalog" for the
    uncalibrated one; the noise test tries only it)."""

    weight: float | None
    held_out: dict[int, tuple[float, float] | None]
    errors: dict[str, float]


def catalog_p_value(targets: Sequence[Target], noise: float = NOISE) -> float:
    """How likely noise alone (``noise`` per figure, log-normal) leaves the catalog's
    errors on ``targets`` as large as they are: the chi-square tail of the sum of squared
    log errors (tok/s, latency, acceptance) over ``noise``; a point the catalog says cannot
    run counts as a factor-10 miss."""
    residuals = _residuals(targets, DEFAULT_CONSTANTS)
    statistic = sum(residual * residual for residual in residuals) / noise**2
    return float(chi2.sf(statistic, len(residuals)))


def choose_prior(targets: Sequence[Target], *, free: Sequence[str] | None = None) -> PriorChoice:
    """Cross-validate each of ``PRIOR_WEIGHTS`` and the uncalibrated catalog (see the
    module docstring); the catalog wins a tie, then the stronger prior."""
    catalog = [predicted(target, DEFAULT_CONSTANTS) for target in targets]
    errors = {"catalog": float(np.median(_abs_errors(targets, catalog)))}
    held_outs: dict[str, dict[int, tuple[float, float] | None]] = {
        "catalog": dict(enumerate(catalog))
    }
    for weight in PRIOR_WEIGHTS:
        held_out: dict[int, tuple[float, float] | None] = {}
        for fold in _folds(len(targets)):
            rest = [target for index, target in enumerate(targets) if index not in fold]
            fold_constants = fit_constants(rest, free=free, prior_weight=weight)
            for index in fold:
                held_out[index] = predicted(targets[index], fold_constants)
        figures = [held_out[index] for index in range(len(targets))]
        errors[f"{weight:g}"] = float(np.median(_abs_errors(targets, figures)))
        held_outs[f"{weight:g}"] = held_out
    order = ["catalog", *(f"{weight:g}" for weight in sorted(PRIOR_WEIGHTS, reverse=True))]
    best = min(order, key=lambda key: (errors[key], order.index(key)))
    weight = None if best == "catalog" else float(best)
    return PriorChoice(weight=weight, held_out=held_outs[best], errors=errors)


def calibrate(
    targets: Sequence[Target],
    *,
    hardware: str,
    model: str,
    source: str,
    engine_version: str | None = None,
    workload_digest: str | None = None,
    free: Sequence[str] | None = None,
    cross_validate: bool = True,
) -> CalibrationProfile:
    """Fit ``targets`` and record the fit. The catalog is kept when the points are within
    noise of it (``catalog_p_value`` at least ``EVIDENCE``). Otherwise, with
    cross-validation (>= 3 targets), the prior's strength is chosen by it, the catalog is
    kept when no fit beats it on held-out points, and the expected error is the chosen
    candidate's held-out error."""
    choice: PriorChoice | None = None
    p_value = catalog_p_value(targets)
    if p_value >= EVIDENCE:  # the catalog's own errors on the points are held out
        catalog = [predicted(target, DEFAULT_CONSTANTS) for target in targets]
        error = float(np.median(_abs_errors(targets, catalog)))
        choice = PriorChoice(None, held_out=dict(enumerate(catalog)), errors={"catalog": error})
    elif cross_validate and len(targets) >= 3:
        choice = choose_prior(targets, free=free)
    weight = PRIOR_WEIGHT if choice is None else choice.weight
    constants = (
        DEFAULT_CONSTANTS
        if weight is None
        else fit_constants(targets, free=free, prior_weight=weight)
    )
    held_out = {} if choice is None else choice.held_out
    points, errors = [], []
    for index, target in enumerate(targets):
        before = predicted(target, DEFAULT_CONSTANTS)
        after = predicted(target, constants)
        point = FittedPoint(
            label=target.label,
            measured_tok_s=target.tok_s,
            measured_latency_s=target.latency_s,
            measured_acceptance_length=target.acceptance_length,
            uncalibrated_tok_s=before and before[0],
            uncalibrated_latency_s=before and before[1],
            calibrated_tok_s=after and after[0],
            calibrated_latency_s=after and after[1],
            held_out_tok_s=(held_out.get(index) or (None, None))[0],
            held_out_latency_s=(held_out.get(index) or (None, None))[1],
            measured_kv_cache_tokens=target.kv_cache_tokens,
            model_kv_cache_tokens=plan_memory(target.config).kv_cache_tokens,
        )
        points.append(point)
        errors += [
            abs(e) for e in (point.held_out_errors if held_out else point.errors) if e is not None
        ]
    fitted: list[str] = []
    if weight is not None:  # the names fit_constants moved (a sensitivity test: predictions)
        scalars, positions = fitted_names(targets, free)
        fitted = [*scalars, *(["mtp_acceptance"] if positions else [])]
    return CalibrationProfile(
        hardware=hardware,
        model=model,
        engine_version=engine_version,
        workload_digest=workload_digest,
        source=source,
        constants=constants,
        fitted=fitted,
        prior_weight=weight,
        catalog_p_value=p_value,
        cross_validation={} if choice is None else choice.errors,
        points=points,
        expected_error=float(np.median(errors)) if errors else None,
        expected_error_basis="cross-validation" if held_out else "residuals",
    )
