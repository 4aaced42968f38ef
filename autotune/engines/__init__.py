"""Engines: launch a vLLM-compatible server for a TrialConfig, report, stop."""

from __future__ import annotations

from typing import Any

from autotune.engines.base import BaseEngine, Server
from autotune.engines.process import kill_all_servers
from autotune.engines.sim import SimEngine
from autotune.engines.versions import gate_flags
from autotune.engines.vllm import VllmEngine
from autotune.engines.vllm_log import classify_failure, parse_engine_stats, parse_startup_log
from autotune.errors import InputError
from autotune.vocabulary import Failure, FailureClass, HardwareFingerprint, StartupReport

ENGINES: dict[str, type[BaseEngine]] = {"sim": SimEngine, "vllm": VllmEngine}


def make_engine(name: str, **options: Any) -> BaseEngine:
    """The engine called ``name`` ("sim" or "vllm"), built with its keyword options.

    Raises ``InputError`` for an unknown name or option, ``EngineError`` when the
    engine cannot be set up (e.g. no vLLM executable).
    """
    try:
        engine_class = ENGINES[name]
    except KeyError:
        raise InputError(
            f"engine must be one of {', '.join(sorted(ENGINES))}, but got engine={name!r}"
        ) from None
    try:
        return engine_class(**options)
    except TypeError as exc:
        raise InputError(f"engine {name!r}: {exc}") from exc


__all__ = [
    "ENGINES",
    "BaseEngine",
    "Failure",
    "FailureClass",
    "HardwareFingerprint",
    "Server",
    "SimEngine",
    "StartupReport",
    "VllmEngine",
    "classify_failure",
    "gate_flags",
    "kill_all_servers",
    "make_engine",
    "parse_engine_stats",
    "parse_startup_log",
]
