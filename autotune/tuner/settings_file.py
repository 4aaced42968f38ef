"""What `autotune run` reads beside its options: the tuner's settings and the rarely
changed load, simulator and engine details (docs/tuner.md).

The same keys go in a space file's ``tuner:`` section and in a ``--tuner FILE``; a key
the file sets wins over the space's, key by key (inside ``load:``, ``simulator:`` and
``engine:`` too), and a key neither sets keeps its default. Paths are read from the
working directory, as the command line's are. Bad input is one line naming the file,
the line and the key, echoing the value; an unknown key gets a did-you-mean.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.config.space import load_space
from autotune.defaults import DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_TIME_SCALE
from autotune.errors import SettingsError
from autotune.replay.load import LoadSpec
from autotune.tuner.settings import TunerSettings

_LOAD = LoadSpec()
SPACE_SECTION = "tuner"  # the space file's section that holds these keys


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class LoadSettings(_Section):
    """How each trial replays the workload, beyond ``--mode``, ``--concurrency`` and
    ``--duration`` (``LoadSpec``'s fields of the same names)."""

    max_requests: int | None = Field(default=_LOAD.max_requests, ge=1)
    timing_scale: float = Field(default=_LOAD.timing_scale, gt=0)
    max_gap_s: float | None = Field(default=_LOAD.max_gap_s, ge=0)  # None: no cap
    warmup_requests: int = Field(default=_LOAD.warmup_requests, ge=0)


class SimulatorSettings(_Section):
    """The simulated server (``--engine sim``) and the tuner's predictions."""

    time_scale: float = Field(default=DEFAULT_TIME_SCALE, gt=0)
    noise: float = Field(default=0.0, ge=0)
    calibration: Path | None = Field(default=None, strict=False)


class EngineSettings(_Section):
    """How a real engine is started (``--engine vllm``)."""

    vllm_executable: str = "vllm"
    tokenizer: str | None = None  # the served model's tokenizer when not found from --model
    startup_timeout_s: float = Field(default=DEFAULT_STARTUP_TIMEOUT_S, gt=0)


class _Document(TunerSettings):
    """One source's keys: the tuner's, flat, and the three sections."""

    load: LoadSettings = LoadSettings()
    simulator: SimulatorSettings = SimulatorSettings()
    engine: EngineSettings = EngineSettings()


SECTIONS = {"load": LoadSettings, "simulator": SimulatorSettings, "engine": EngineSettings}


@dataclass(frozen=True)
class RunSettings:
    """The settings a run uses, and which file set each key that is not its default."""

    tuner: TunerSettings = field(default_factory=TunerSettings)
    load: LoadSettings = field(default_factory=LoadSettings)
    simulator: SimulatorSettings = field(default_factory=SimulatorSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    origin: dict[str, str] = field(default_factory=dict)  # dotted key -> where it was set

    def load_spec(self, *, mode: str, concurrency: int, duration_s: float | None) -> LoadSpec:
        """The trial's load: the command line's mode, concurrency and budget, these details."""
        return LoadSpec(
            mode=mode,  # type: ignore[arg-type]  # pydantic validates the literal
            concurrency=concurrency,
            duration_s=duration_s,
            **self.load.model_dump(),
        )

    def run_options(self) -> dict[str, Any]:
        """The ``RunOptions`` fields these settings fill (all but the load)."""
        return {
            "tuner": self.tuner,
            "time_scale": self.simulator.time_scale,
            "noise": self.simulator.noise,
            "calibration": self.simulator.calibration,
            "vllm_executable": self.engine.vllm_executable,
            "tokenizer": self.engine.tokenizer,
            "startup_timeout_s": self.engine.startup_timeout_s,
        }

    def describe(self) -> str | None:
        """One line naming each key set away from its default, by the file that set it."""
        by_file: dict[str, list[str]] = {}
        for key, value in _changed(self):
            by_file.setdefault(self.origin.get(key, "?"), []).append(f"{key}={_text(value)}")
        if not by_file:
            return None
        return "settings: " + "; ".join(
            f"{', '.join(pairs)} ({where})" for where, pairs in by_file.items()
        )


def read_run_settings(space_path: Path, tuner_file: Path | None = None) -> RunSettings:
    """The space's ``tuner:`` section, then ``tuner_file`` over it; raises SettingsError
    (or the space's SpaceError) naming the file, line and key."""
    sources: list[tuple[str, list[str], dict[str, Any]]] = []
    section = load_space(space_path).tuner
    if section:
        sources.append((str(space_path), [SPACE_SECTION], section))  # tuner.KEY at its line
    if tuner_file is not None:
        sources.append((str(tuner_file), [], _read_file(tuner_file)))
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for where, prefix, raw in sources:
        _validate(raw, where, prefix)
        label = f"{where} {SPACE_SECTION}:" if prefix else where
        for key, value in raw.items():
            if key in SECTIONS and isinstance(value, dict):
                merged[key] = {**merged.get(key, {}), **value}
                origin |= {f"{key}.{name}": label for name in value}
            else:
                merged[key] = value
                origin[key] = label
    document = _Document.model_validate(merged)
    tuner_keys = set(TunerSettings.model_fields)
    tuner = TunerSettings.model_validate(document.model_dump(include=tuner_keys))
    return RunSettings(
        tuner=tuner,
        load=document.load,
        simulator=document.simulator,
        engine=document.engine,
        origin=origin,
    )


def _read_file(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"--tuner {path}: no such settings file") from None
    except OSError as exc:
        raise SettingsError(f"--tuner {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SettingsError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SettingsError(f"{path}: a settings file is a YAML mapping of keys (docs/tuner.md)")
    return raw


def _validate(raw: dict[str, Any], where: str, prefix: list[str]) -> None:
    """SettingsError for the first bad key of one source, at its line."""
    try:
        _Document.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first["loc"]]
        line = _line_of(Path(where), [*prefix, *loc])
        place = f"{where}:{line}" if line else where
        key = ".".join([*prefix, *loc])
        if first["type"] == "extra_forbidden":
            message = f"unknown setting{_did_you_mean(loc)}"
        else:
            message = f"{first['msg']} (got {first['input']!r})"
        raise SettingsError(f"{place}: {key}: {message}") from None


def _did_you_mean(loc: list[str]) -> str:
    model: type[BaseModel] = SECTIONS[loc[0]] if len(loc) > 1 else _Document
    known = list(model.model_fields)
    close = difflib.get_close_matches(loc[-1], known, n=1)
    return f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(known)})"


def _line_of(path: Path, keys: list[str]) -> int | None:
    """The 1-based line of the key at ``keys`` in a YAML file, when it is there."""
    try:
        node = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return line
        match = next((pair for pair in node.value if pair[0].value == key), None)
        if match is None:
            return line
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def _changed(settings: RunSettings) -> list[tuple[str, Any]]:
    changed = list(settings.tuner.changed().items())
    for name, model in SECTIONS.items():
        default = model()
        for key, value in getattr(settings, name).model_dump().items():
            if value != getattr(default, key):
                changed.append((f"{name}.{key}", value))
    return changed


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return f"{value:g}" if isinstance(value, float) else str(value)
