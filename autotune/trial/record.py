"""What one trial stores: the one model of a trial's Optuna user attrs, its writer and reader.

The study writes a ``TrialRecord`` to each trial (``write``), the results
commands read it back (``TrialRecord.read``, ``results.reader.TrialRow``), and
docs/architecture.md lists its fields (a test keeps the table equal to the
model). Studies written before a field existed still read: a missing key
takes the field's default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field

from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError
from autotune.redaction import redact_json
from autotune.replay.records import ReplayStats
from autotune.vocabulary import (
    MEASURED_OUTCOMES,
    Failure,
    FailureClass,
    HardwareFingerprint,
    Outcome,
    ServerStats,
    StartupReport,
)

_OUTCOMES = ", ".join(f"`{value}`" for value in (*Outcome, *FailureClass))


class _AttrTarget(Protocol):
    def set_user_attr(self, key: str, value: Any) -> None: ...


class TrialRecord(BaseModel):
    """A trial's user attrs, typed. Every field has a default: old studies lack some."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    outcome: Outcome | FailureClass | None = Field(
        None, description=f"an `Outcome` or `FailureClass` value ({_OUTCOMES}); null if none"
    )
    is_baseline: bool = Field(False, description="true for the space's baseline config")
    retry_of: int | None = Field(
        None,
        description="the number of the trial this one re-runs, interrupted (Ctrl-C, SIGTERM) or "
        "killed (its heartbeat went stale), or null",
    )
    config: TrialConfig | None = Field(
        None,
        description="`TrialConfig` as a dict (`model`, `flags`, `env`), derived flags included",
    )
    argv: tuple[str, ...] | None = Field(
        None, description="the exact argv launched (list of strings), or null if not launched"
    )
    startup: StartupReport | None = Field(None, description="`StartupReport` dict or null")
    replay: ReplayStats | None = Field(None, description="`ReplayStats` dict or null")
    server_stats: ServerStats | None = Field(None, description="`ServerStats` dict or null")
    failure: Failure | None = Field(None, description="`Failure` dict or null")
    memory: dict[str, Any] | None = Field(
        None, description="the simulator's memory estimate (`MemoryReport` dict) or null"
    )
    engine_version: str | None = Field(
        None, description="as in the study attrs (a trial may run on a newer engine)"
    )
    hardware: HardwareFingerprint | None = Field(
        None, description="`HardwareFingerprint` dict, as in the study attrs"
    )
    wall_s: float | None = Field(None, description="the trial's wall time in seconds")
    worker: str | None = Field(
        None, description="who ran it: `host:pid`, and `gpus G` with a GPU group (several workers)"
    )
    error: str | None = Field(
        None, description="autotune's own error (outcome `error`, a FAIL trial), or null"
    )
    rule_violations: tuple[str, ...] | None = Field(
        None, description="the space's rules the config breaks (outcome `rule-violated`), or null"
    )
    warm_start: int | None = Field(
        None, description="rank of the warm-start seed this trial launched (1: predicted best)"
    )
    confirms: int | None = Field(
        None, description="the trial whose config this one re-measures (confirmation), or null"
    )
    neighbour_of: int | None = Field(
        None,
        description="the measured trial whose config this one's is a neighbour of off the "
        "lattice (measured local search), or null",
    )
    duplicate_of: int | None = Field(
        None,
        description="the trial that measured this effective config (outcome `duplicate`, no "
        "launch), or null",
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="true when the outcome is `ok`, `slo-violated` or `errors` and a replay is "
        "stored: the trial's values are measurements, not placeholders (written, never read)"
    )
    @property
    def measured(self) -> bool:
        """The server ran and the replay produced figures: the trial's values are real."""
        return self.replay is not None and self.outcome in MEASURED_OUTCOMES

    @property
    def reason(self) -> str | None:
        """Why the tuner launched this trial, when not the sampler's pick: a warm-start
        seed, a re-measurement or a neighbour off the lattice (for the logs)."""
        if self.confirms is not None:
            return f"re-measures #{self.confirms}"
        if self.neighbour_of is not None:
            return f"neighbour of #{self.neighbour_of}"
        if self.warm_start is not None:
            return f"warm start {self.warm_start}"
        return None

    def attrs(self) -> dict[str, Any]:
        """The user attrs to store: the fields set on this record, JSON-ready, and ``measured``;
        any secret-looking text redacted (a study keeps no key)."""
        return redact_json(self.model_dump(mode="json", exclude_unset=True))

    def write(self, trial: _AttrTarget) -> None:
        """Store the fields set on this record as user attrs of ``trial`` (the one writer)."""
        for key, value in self.attrs().items():
            trial.set_user_attr(key, value)

    @classmethod
    def read(cls, attrs: Mapping[str, Any], *, where: str = "trial user attr") -> Self:
        """The record in ``attrs`` (the one reader); ``InputError`` names the bad field."""
        try:
            return cls.model_validate(dict(attrs))
        except ValidationError as exc:
            first = exc.errors()[0]
            path = ".".join(str(part) for part in first["loc"])
            raise InputError(f"{where} {path}: {first['msg']}") from exc


def outcome_text(outcome: str | None, state: str) -> str:
    """The outcome to show for a stored trial; a FAIL without one was killed mid-trial."""
    if outcome:
        return str(outcome)
    return Outcome.INTERRUPTED.value if state == "FAIL" else state.lower()


def attrs_table() -> str:
    """The markdown table of trial user attrs in docs/architecture.md, from the model."""
    described = {name: field.description for name, field in TrialRecord.model_fields.items()}
    described |= {
        name: field.description for name, field in TrialRecord.model_computed_fields.items()
    }
    lines = ["| key | value |", "| --- | --- |"]
    lines += [f"| `{name}` | {text} |" for name, text in described.items()]
    return "\n".join(lines)
