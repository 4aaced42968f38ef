"""Published vLLM serving measurements (docs/measurements/published-vllm-runs.yaml), typed.

Each point is one published ``vllm bench serve`` (or alike) run: where it was published,
the vLLM version, GPU and tensor parallelism, model and precision, the benchmark's shape
and the figures it printed. The simulator is held to them by
``calibration/published_table.py`` (scripts/bench_published.py prints the table).

``load_published`` reads the file; a point that does not fit the schema is one
``InputError`` naming the file, the point's line and id, and the field.
"""

from __future__ import annotations

import math
from pathlib import Path
from urllib.parse import urlparse

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from autotune.errors import InputError

PUBLISHED_FILE = Path(__file__).resolve().parents[2] / "docs/measurements/published-vllm-runs.yaml"


class PublishedBenchmark(BaseModel):
    """The benchmark's shape, as the source states it (None: not stated)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    tool: str
    dataset: str  # random, sharegpt, or what the source names (a predictor may decline it)
    input_len: int | None = Field(default=None, ge=1)
    output_len: int | None = Field(default=None, ge=1)
    # ShareGPT (and runs stopped by EOS): the printed totals over the request count.
    mean_input_tokens_measured: float | None = Field(default=None, gt=0)
    mean_output_tokens_measured: float | None = Field(default=None, gt=0)
    range_ratio: float | None = Field(default=None, ge=0, lt=1)
    num_prompts: int | None = Field(default=None, ge=1)
    max_concurrency: int | None = Field(default=None, ge=1)
    request_rate: float = math.inf  # requests/s; inf (or not stated): all at once
    burstiness: float | None = Field(default=None, gt=0)
    ignore_eos: bool | None = None
    seed: int | None = None

    @field_validator("request_rate", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        return math.inf if value in ("inf", "infinite", None) else value


class PublishedFigures(BaseModel):
    """What the source printed: tok/s, req/s and milliseconds (None: not given)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    output_throughput_tok_s: float | None = Field(default=None, gt=0)
    request_throughput_rps: float | None = Field(default=None, gt=0)
    total_token_throughput_tok_s: float | None = Field(default=None, gt=0)
    mean_ttft_ms: float | None = Field(default=None, gt=0)
    median_ttft_ms: float | None = Field(default=None, gt=0)
    p99_ttft_ms: float | None = Field(default=None, gt=0)
    mean_tpot_ms: float | None = Field(default=None, gt=0)
    median_tpot_ms: float | None = Field(default=None, gt=0)
    p99_tpot_ms: float | None = Field(default=None, gt=0)
    mean_itl_ms: float | None = Field(default=None, gt=0)
    median_itl_ms: float | None = Field(default=None, gt=0)
    p99_itl_ms: float | None = Field(default=None, gt=0)


class PublishedPoint(BaseModel):
    """One published run."""

    model_config = ConfigDict(frozen=True, extra="allow")

    id: str
    source_url: str | None = None
    source_locator: str | None = None  # where to find a source without a stable URL
    vllm_version: str | None = None
    gpu: str  # a catalog name
    tensor_parallel: int = Field(default=1, ge=1)
    model: str  # Hugging Face id
    precision: str = ""
    kv_cache_dtype: str | None = None
    server_flags: dict[str, object] | None = None
    benchmark: PublishedBenchmark
    figures: PublishedFigures
    group: str | None = None
    pair: str | None = None
    notes: str | None = None

    @field_validator("vllm_version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        return None if value is None else str(value)

    @model_validator(mode="after")
    def _located(self) -> PublishedPoint:
        if not (self.source_url or self.source_locator):
            raise ValueError("a point needs a source_url or a source_locator")
        return self

    @property
    def source(self) -> str:
        """The publication this point is from: a GitHub repository (an issue or pull
        request of its own), else the web site, else the locator's first words. What the
        held-out split splits by, so no publication is on both sides."""
        if not self.source_url:
            return " ".join(str(self.source_locator).split()[:8])
        parsed = urlparse(self.source_url)
        parts = [part for part in parsed.path.split("/") if part]
        if parsed.netloc == "github.com" and len(parts) >= 2:
            thread = parts[2:4] if len(parts) >= 4 and parts[2] in ("issues", "pull") else []
            return "/".join(["github.com", *parts[:2], *thread])
        return parsed.netloc


def load_published(path: Path = PUBLISHED_FILE) -> list[PublishedPoint]:
    """Every point of ``path``; InputError ``FILE:LINE: point ID: field: why`` on bad data."""
    try:
        text = path.read_text(encoding="utf-8")
        items = yaml.safe_load(text)
        lines = [node.start_mark.line + 1 for node in yaml.compose(text).value]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError) as exc:
        raise InputError(f"{path}: cannot read the published points: {exc}") from exc
    if not isinstance(items, list):
        raise InputError(f"{path}: expected a YAML list of points")
    points: list[PublishedPoint] = []
    seen: set[str] = set()
    for line, item in zip(lines, items, strict=True):
        name = item.get("id", "?") if isinstance(item, dict) else "?"
        try:
            point = PublishedPoint.model_validate(item)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "(point)"
            raise InputError(f"{path}:{line}: point {name}: {field}: {first['msg']}") from None
        if point.id in seen:
            raise InputError(f"{path}:{line}: point {name}: id: used by an earlier point")
        seen.add(point.id)
        points.append(point)
    return points
