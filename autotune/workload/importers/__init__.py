"""Importers: foreign traces and logs -> workload files (with a report of what was dropped)."""

from __future__ import annotations

from autotune.workload.importers._report import ImportReport
from autotune.workload.importers.dispatch import SOURCES, import_workload
from autotune.workload.importers.mooncake import import_mooncake
from autotune.workload.importers.requests_log import import_requests_log
from autotune.workload.importers.sharegpt import import_sharegpt
from autotune.workload.importers.weka import import_weka

__all__ = [
    "SOURCES",
    "ImportReport",
    "import_mooncake",
    "import_requests_log",
    "import_sharegpt",
    "import_weka",
    "import_workload",
]
