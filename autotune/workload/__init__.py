"""Workloads: the JSONL format, expansion to a WorkloadPlan, importers, generators, recorder."""

from __future__ import annotations

from autotune.workload.expand import expand, load_plan
from autotune.workload.hf_tokenizer import HfTokenizer, load_tokenizer
from autotune.workload.io import Workload, read_workload, write_workload
from autotune.workload.plan import Endpoint, Message, PlannedRequest, WorkloadPlan
from autotune.workload.schema import FORMAT_NAME, FORMAT_VERSION
from autotune.workload.tokenizer import Tokenizer, WordTokenizer

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Endpoint",
    "HfTokenizer",
    "Message",
    "PlannedRequest",
    "Tokenizer",
    "WordTokenizer",
    "Workload",
    "WorkloadPlan",
    "expand",
    "load_plan",
    "load_tokenizer",
    "read_workload",
    "write_workload",
]
