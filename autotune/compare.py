"""Compare the best configs of several studies (GPUs, engine versions, models) in one table."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict
from rich.table import Table

from autotune.errors import InputError
from autotune.explain import format_flag_value
from autotune.study_reader import LoadedStudy, TrialRow

SECONDS_PER_HOUR = 3600
SHORT_FLAGS = (
    "kv-cache-memory-bytes",
    "kv-cache-dtype",
    "max-num-seqs",
    "max-num-batched-tokens",
    "speculative-config",
)


class ComparisonRow(BaseModel):
    """One line of the comparison: a study's best config, measured or predicted."""

    model_config = ConfigDict(frozen=True)

    study: str
    gpu: str
    engine_version: str | None
    model: str | None
    trial: int | None
    best_config: str
    output_throughput_tok_s: float | None
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    kv_cache_tokens: int | None
    concurrency_reached: int | None
    usd_per_hour: float | None = None
    source: str = "measured"  # "measured" | "predicted (simulator, calibrated x0.93)"

    @property
    def output_tokens_per_usd(self) -> float | None:
        if self.usd_per_hour is None or self.output_throughput_tok_s is None:
            return None
        return self.output_throughput_tok_s * SECONDS_PER_HOUR / self.usd_per_hour


def parse_prices(texts: list[str]) -> dict[str, float]:
    """``["rtx4080s-32g=0.35"]`` -> ``{"rtx4080s-32g": 0.35}`` (USD per hour)."""
    prices: dict[str, float] = {}
    for text in texts:
        gpu, sep, value = text.partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = -1.0
        if not sep or not gpu.strip() or usd <= 0:
            raise InputError(f"--price {text!r}: expected GPU=USD_PER_HOUR, e.g. h100=2.49")
        prices[gpu.strip()] = usd
    return prices


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def price_for(prices: dict[str, float], *names: str) -> float | None:
    """The price whose key names this GPU: exact, else contained in a name (case/dashes ignored)."""
    for key, usd in prices.items():
        if any(_squash(key) == _squash(name) for name in names if name):
            return usd
    for key, usd in prices.items():
        if any(_squash(key) in _squash(name) for name in names if name):
            return usd
    return None


def config_summary(row: TrialRow) -> str:
    """The flags that matter most, short: ``kv-cache-memory-bytes=12 GiB, ...``."""
    flags = row.flags
    shown = [
        f"{n}={format_flag_value(n, flags[n])}" for n in SHORT_FLAGS if flags.get(n) is not None
    ]
    return ", ".join(shown) or "(defaults)"


def study_gpu_names(loaded: LoadedStudy) -> list[str]:
    """Every name the study's GPU goes by (fingerprint name, simulator catalog name)."""
    names = [loaded.info.gpu_name]
    for row in loaded.trials:
        if row.argv and "--hardware" in row.argv:
            names.append(row.argv[row.argv.index("--hardware") + 1])
            break
    return names


def compare_rows(
    studies: list[LoadedStudy], *, prices: dict[str, float] | None = None
) -> list[ComparisonRow]:
    """One measured row per study: its best feasible trial."""
    rows = []
    for loaded in studies:
        best = loaded.best()
        rows.append(
            ComparisonRow(
                study=loaded.name,
                gpu=loaded.info.gpu_name,
                engine_version=best.engine_version or loaded.info.engine_version,
                model=loaded.info.model,
                trial=best.number,
                best_config=config_summary(best),
                output_throughput_tok_s=best.throughput_tok_s,
                ttft_p95_s=best.ttft_p95_s,
                tpot_p95_s=best.tpot_p95_s,
                kv_cache_tokens=best.kv_cache_tokens,
                concurrency_reached=best.concurrency_reached,
                usd_per_hour=price_for(prices or {}, loaded.name, *study_gpu_names(loaded)),
            )
        )
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def comparison_table(rows: list[ComparisonRow]) -> Table:
    """The rich table, one column per study (predicted columns say so in ``source``)."""
    table = Table(title="Best configuration per study", show_lines=True)
    table.add_column("", style="bold")
    for row in rows:
        table.add_column(row.study, overflow="fold")
    lines: list[tuple[str, list[str]]] = [
        ("source", [row.source for row in rows]),
        ("GPU", [row.gpu for row in rows]),
        ("engine", [row.engine_version or "-" for row in rows]),
        ("model", [row.model or "-" for row in rows]),
        ("trial", ["-" if row.trial is None else str(row.trial) for row in rows]),
        ("best config", [row.best_config for row in rows]),
        ("output tok/s", [_fmt(row.output_throughput_tok_s, ",.1f") for row in rows]),
        ("p95 TTFT (s)", [_fmt(row.ttft_p95_s, ".3f") for row in rows]),
        ("p95 TPOT (s)", [_fmt(row.tpot_p95_s, ".4f") for row in rows]),
        ("KV cache tokens", [_fmt(row.kv_cache_tokens, ",") for row in rows]),
        ("peak running", [_fmt(row.concurrency_reached, "d") for row in rows]),
    ]
    if any(row.usd_per_hour is not None for row in rows):
        lines.append(("USD per hour", [_fmt(row.usd_per_hour, ".2f") for row in rows]))
        lines.append(
            ("output tok per USD", [_fmt(row.output_tokens_per_usd, ",.0f") for row in rows])
        )
    for label, cells in lines:
        table.add_row(label, *cells)
    return table
