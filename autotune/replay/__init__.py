"""Replaying a workload against a server, and summarising what it measured."""

from __future__ import annotations

from autotune.replay.load import LoadMode, LoadSpec, ReplayObserver, RequestSlo
from autotune.replay.records import Percentiles, ReplayStats, RequestError, RequestRecord
from autotune.replay.runner import ReplayResult, replay
from autotune.replay.stats import ItlHistogram, compute_stats, records_frame

__all__ = [
    "ItlHistogram",
    "LoadMode",
    "LoadSpec",
    "Percentiles",
    "ReplayObserver",
    "ReplayResult",
    "ReplayStats",
    "RequestError",
    "RequestRecord",
    "RequestSlo",
    "compute_stats",
    "records_frame",
    "replay",
]
