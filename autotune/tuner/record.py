"""What the tuner stores on a study: the warm start's summary and the crown, typed.

``TunerStudyRecord.write`` is the one writer and ``TunerStudyRecord.read`` the one
reader of these study user attrs (the trial attrs ``warm_start``, ``confirms`` and
``duplicate_of`` are fields of ``autotune.trial.record.TrialRecord``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import InputError


class _StudyAttrTarget(Protocol):
    def set_user_attr(self, key: str, value: Any) -> None: ...


class WarmStartSummary(BaseModel):
    """What the warm start predicted before the first launch."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    effective_configs: int = Field(description="distinct launches of the space that fit")
    predicted_feasible: int = Field(description="of those, predicted to meet every constraint")
    seconds: float = Field(description="the latest run's time enumerating and predicting")
    seeds: int = Field(description="predicted-best configs launched right after the baseline")
    predicted_configs: int | None = Field(
        default=None, description="of the effective configs, those predicted (null: all)"
    )
    predicted_now: int | None = Field(
        default=None,
        description="of those, replayed by the latest run (the rest were stored)",
    )
    replayed_configs: int | None = Field(
        default=None,
        description="of the predicted configs, those the replay judged (the rest screened)",
    )
    safety_stop_s: float | None = Field(
        default=None, description="the latest run's safety stop, when it fired (null: did not)"
    )

    @property
    def unpredicted(self) -> int:
        """Effective configs never predicted (the budget or the safety stop left them)."""
        known = self.effective_configs if self.predicted_configs is None else self.predicted_configs
        return self.effective_configs - known


class Winner(BaseModel):
    """The crowned config: the best estimate after every (re-)measurement."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    trial: int = Field(description="the first trial that measured the crowned config")
    trials: list[int] = Field(description="every trial of that config (re-measurements too)")
    mean: float = Field(description="mean of its measurements (first objective)")
    spread: float = Field(description="sample standard deviation of them (0 with one)")
    measurements: int = Field(description="how many times it was measured")
    tied_with: int = Field(
        default=0,
        description="other configs within the measurement noise of it; it needs least of "
        "them (docs/tuner.md)",
    )
    drift_per_trial: float = Field(
        default=0.0,
        description="relative change of the objective per trial that the re-measurements "
        "show (drift of the hardware over the night), taken out when comparing configs",
    )


class TunerStudyRecord(BaseModel):
    """The tuner's study user attrs; either may be absent (other samplers, old studies)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    warm_start: WarmStartSummary | None = None
    winner: Winner | None = None

    def write(self, study: _StudyAttrTarget) -> None:
        """Store the fields set on this record as study user attrs (the one writer)."""
        for key, value in self.model_dump(mode="json", exclude_unset=True).items():
            study.set_user_attr(key, value)

    @classmethod
    def read(cls, attrs: Mapping[str, Any]) -> Self:
        """The record in a study's user attrs (the one reader); ``InputError`` names the field."""
        try:
            return cls.model_validate({key: attrs.get(key) for key in cls.model_fields})
        except ValidationError as exc:
            first = exc.errors()[0]
            path = ".".join(str(part) for part in first["loc"])
            raise InputError(f"study user attr {path}: {first['msg']}") from exc


def tuner_attrs_table() -> str:
    """The markdown table of the tuner's study attrs in docs/architecture.md, from the models."""
    lines = ["| key | field | value |", "| --- | --- | --- |"]
    for key, model in (("warm_start", WarmStartSummary), ("winner", Winner)):
        for name, field in model.model_fields.items():
            lines.append(f"| `{key}` | `{name}` | {field.description} |")
    return "\n".join(lines)
