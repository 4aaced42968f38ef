"""Measured closed-loop points: the input of ``autotune sim calibrate --points FILE``.

FILE is JSON: a list of objects, one per measured run of N clients each
sending fixed-size requests back to back (the field notes' hand-run table):

    [{"concurrency": 8, "mtp": 2, "prompt_tokens": 128, "output_tokens": 256,
      "output_tokens_per_s": 331.0, "mean_latency_s": 6.05}, ...]

Optional per point: ``kv_cache_dtype``, ``kv_cache_memory_bytes``,
``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
``enforce_eager`` (other flags stay at the hardware's baseline, see
sim/virtual/sweep.py), ``requests_per_client`` (rounds each client ran; default 4)
and ``mean_acceptance_length`` (vLLM's ``1 + accepted / drafts`` from
``/metrics``, which pins MTP acceptance directly). A bad entry is one line,
``FILE:INDEX:FIELD: why`` (INDEX counts from 0).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import InputError
from autotune.sim.virtual.sweep import REQUESTS_PER_CLIENT


class MeasuredPoint(BaseModel):
    """One measured closed-loop run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(ge=1)
    mtp: int = Field(ge=0)
    prompt_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    output_tokens_per_s: float = Field(gt=0)
    mean_latency_s: float = Field(gt=0)
    kv_cache_dtype: str | None = None
    kv_cache_memory_bytes: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    enforce_eager: bool | None = None
    requests_per_client: int = Field(REQUESTS_PER_CLIENT, ge=1)
    mean_acceptance_length: float | None = Field(None, ge=1)

    @property
    def label(self) -> str:
        return f"c={self.concurrency} mtp={self.mtp} {self.prompt_tokens}/{self.output_tokens}"


def load_points(path: Path) -> list[MeasuredPoint]:
    """Read a points file; InputError ``FILE:INDEX:FIELD: why`` on the first bad entry."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read points file: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from exc
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{path}: a points file is a non-empty JSON list of measured points")
    points = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise InputError(f"{path}:{index}: a point is a JSON object, got {entry!r}")
        try:
            points.append(MeasuredPoint.model_validate(entry))
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(part) for part in error["loc"]) or "(point)"
            raise InputError(f"{path}:{index}:{field}: {error['msg']}") from exc
    return points


def save_points(points: list[MeasuredPoint], path: Path) -> None:
    """Write points in the file format above (unset optional fields left out)."""
    rows = [point.model_dump(exclude_none=True) for point in points]
    path.write_text(json.dumps(rows, indent=1) + "\n")
