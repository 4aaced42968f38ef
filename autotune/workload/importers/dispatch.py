"""Pick the importer for ``--from``."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import InputError
from autotune.workload.importers._report import ImportReport
from autotune.workload.importers.mooncake import import_mooncake
from autotune.workload.importers.requests_log import import_requests_log
from autotune.workload.importers.sharegpt import import_sharegpt
from autotune.workload.importers.weka import import_weka
from autotune.workload.io import Workload
from autotune.workload.plan import Endpoint

SOURCES = ("weka", "mooncake", "sharegpt", "openai-log", "anthropic-log")


def import_workload(
    kind: str, source: Path, *, endpoint: Endpoint = "openai.chat"
) -> tuple[Workload, ImportReport]:
    """Import ``source`` as ``kind`` (one of SOURCES). Logs keep their own endpoints."""
    if kind not in SOURCES:
        raise InputError(f"--from: must be one of {', '.join(SOURCES)}, but got {kind!r}")
    if not source.exists():
        raise InputError(f"{source}: no such file or directory")
    if kind == "weka":
        return import_weka(source, endpoint=endpoint)
    if kind == "mooncake":
        return import_mooncake(source, endpoint=endpoint)
    if kind == "sharegpt":
        return import_sharegpt(source, endpoint=endpoint)
    return import_requests_log(source, kind=kind.removesuffix("-log"))
