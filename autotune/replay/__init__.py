"""Replaying a workload against a server, and summarising what it measured.

The names below are loaded on first use (PEP 562): the simulator server imports
``autotune.replay.payloads`` and should not pay for the replayer's pandas and aiohttp
each time it starts.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    "LoadMode": "load",
    "LoadSpec": "load",
    "ReplayObserver": "load",
    "RequestSlo": "load",
    "Percentiles": "records",
    "ReplayStats": "records",
    "RequestError": "records",
    "RequestRecord": "records",
    "ReplayResult": "runner",
    "replay": "runner",
    "ItlHistogram": "stats",
    "compute_stats": "stats",
    "records_frame": "stats",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
