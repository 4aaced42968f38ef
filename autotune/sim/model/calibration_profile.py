"""Calibration profiles: speed constants fitted to measurements, and what they were fitted on.

A ``CalibrationProfile`` is YAML on disk (``save_profile`` / ``load_profile``).
It carries a ``SpeedConstants`` value plus its provenance (GPU, model, engine
version, workload digest, the measured points with their residuals) and the
relative error a prediction made with it should expect. Anything that
predicts takes one: ``predict(..., calibration=profile)``, ``sim serve
--calibration``, ``sim predict --calibration``, ``compare --what-if
--calibration``. A bare ``CalibrationProfile(constants=SpeedConstants(...))``
is a valid profile for any GPU and model (what a perturbed "truth" model is).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from autotune.errors import InputError
from autotune.sim.model.config import SimConfig
from autotune.sim.model.speed_constants import DEFAULT_CONSTANTS, SpeedConstants, gpu_constants

PROFILE_VERSION = 1


class FittedPoint(BaseModel):
    """One measurement the fit used, with what the model predicts before and after it."""

    model_config = ConfigDict(frozen=True)

    label: str  # e.g. "c=8 mtp=2 128/256" or "trial 3"
    measured_tok_s: float
    measured_latency_s: float
    uncalibrated_tok_s: float | None
    uncalibrated_latency_s: float | None
    calibrated_tok_s: float | None
    calibrated_latency_s: float | None
    measured_acceptance_length: float | None = None
    # Predicted by a fit that did not see this point (cross-validation); None: not run.
    held_out_tok_s: float | None = None
    held_out_latency_s: float | None = None
    measured_kv_cache_tokens: int | None = None  # the startup log's, when known
    model_kv_cache_tokens: int | None = None  # the memory model's

    @property
    def errors(self) -> tuple[float | None, float | None]:
        """Calibrated relative error of throughput and mean latency (signed)."""
        return (
            _relative(self.calibrated_tok_s, self.measured_tok_s),
            _relative(self.calibrated_latency_s, self.measured_latency_s),
        )

    @property
    def held_out_errors(self) -> tuple[float | None, float | None]:
        """The same for the fit that did not see this point."""
        return (
            _relative(self.held_out_tok_s, self.measured_tok_s),
            _relative(self.held_out_latency_s, self.measured_latency_s),
        )


def _relative(predicted: float | None, measured: float) -> float | None:
    return None if predicted is None else predicted / measured - 1.0


class CalibrationProfile(BaseModel):
    """Speed constants for one GPU and model, and the evidence behind them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = PROFILE_VERSION
    hardware: str | None = None  # catalog GPU; None: applies to any
    model: str | None = None  # catalog model; None: applies to any
    engine_version: str | None = None
    workload_digest: str | None = None
    source: str = ""  # the points file, or "study NAME"
    constants: SpeedConstants = DEFAULT_CONSTANTS
    fitted: list[str] = []  # which constants the fit moved
    # The prior's weight cross-validation chose (calibration/fit.py, PRIOR_WEIGHTS); None
    # with no fitted constants: the catalog's held out better than any fit.
    prior_weight: float | None = None
    # How likely measurement noise alone leaves the catalog's errors on the points as large
    # as measured (calibration/fit.py, catalog_p_value): at EVIDENCE or more, nothing moved.
    catalog_p_value: float | None = None
    cross_validation: dict[str, float] = {}  # held-out median error of each candidate
    points: list[FittedPoint] = []
    # Expected relative error of a prediction: the median absolute error, throughput and
    # latency together, of held-out points (cross-validation) or else of the fit's residuals.
    expected_error: float | None = None
    expected_error_basis: Literal["cross-validation", "residuals"] | None = None
    _path: Path | None = PrivateAttr(default=None)  # the file it was loaded from

    @property
    def name(self) -> str:
        """How messages name the profile: its file, else what it was fitted on."""
        return str(self._path) if self._path else self.source or "(unnamed profile)"

    def digest(self) -> str:
        """A hash of the profile's content (not of its file's name or layout)."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def provenance(self) -> dict[str, Any]:
        """What a study stores of the profile it used: its digest and what it was fitted on."""
        return {
            "digest": self.digest(),
            "path": str(self._path) if self._path else None,
            "hardware": self.hardware,
            "model": self.model,
            "engine_version": self.engine_version,
            "workload_digest": self.workload_digest,
            "source": self.source,
            "fitted": list(self.fitted),
            "points": len(self.points),
            "expected_error": self.expected_error,
        }

    def check_applies(self, config: SimConfig) -> None:
        """InputError when the profile was fitted on another GPU or model than ``config``'s."""
        self.check_fitted_for(config.hardware, config.model)

    def check_fitted_for(self, hardware: str, model: str) -> None:
        """InputError when the profile was fitted on another GPU or model than these."""
        for field, wanted in (("hardware", hardware), ("model", model)):
            fitted_on = getattr(self, field)
            if fitted_on is not None and fitted_on != wanted:
                raise InputError(
                    f"calibration profile {self.name} was fitted for "
                    f"{field} {fitted_on!r}, not {wanted!r}"
                )


def save_profile(profile: CalibrationProfile, path: Path) -> None:
    """Write ``profile`` as YAML (atomically: a temporary file, then a rename)."""
    text = yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def load_profile(path: Path) -> CalibrationProfile:
    """Read a profile; InputError naming the file and the first bad field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read calibration profile: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}{line}: not YAML: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a calibration profile is a YAML mapping")
    if raw.get("version", PROFILE_VERSION) != PROFILE_VERSION:
        raise InputError(
            f"{path}: version: profile version {raw.get('version')!r} is not supported "
            f"(expected {PROFILE_VERSION})"
        )
    try:
        profile = CalibrationProfile.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        raise InputError(f"{path}: {field}: {error['msg']}") from exc
    profile._path = path
    return profile


def profile_constants(
    calibration: CalibrationProfile | None, config: SimConfig
) -> tuple[SpeedConstants, float | None]:
    """The constants and expected error to predict ``config`` with (none given: the
    catalog's for its GPU)."""
    if calibration is None:
        return gpu_constants(config.hardware), None
    calibration.check_applies(config)
    return calibration.constants, calibration.expected_error
