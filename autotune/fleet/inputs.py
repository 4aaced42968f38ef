"""The plan's inputs checked before anything is tuned: each refusal one line naming the
flag, the value and the rule (exit 2), so that no input makes a plan that misleads."""

from __future__ import annotations

from autotune.catalog.hardware import MAX_TENSOR_PARALLEL_SIZE, gpu_names
from autotune.catalog.models import ModelSpec
from autotune.catalog.prices import price_for
from autotune.errors import InputError
from autotune.fleet.routing import routed_units
from autotune.workload.plan import WorkloadPlan

# Every GPU kind is assumed to come in nodes of 8 (an HGX-style server; the catalog
# records no node size per kind), and the simulator models no TP across nodes.
NODE_GPUS = MAX_TENSOR_PARALLEL_SIZE


def check_tp_sizes(model: ModelSpec, sizes: list[int]) -> None:
    """Each ``--tp`` size fits one node and shards ``model`` as vLLM can."""
    for tp in sizes:
        if tp > NODE_GPUS:
            raise InputError(
                f"--tp {tp}: the simulator models one node of at most {NODE_GPUS} GPUs "
                "(assumed for every GPU kind: an 8-GPU server)"
            )
        refusal = model.tensor_parallel_refusal(tp)
        if refusal is not None:
            raise InputError(f"--tp {tp}: vLLM refuses it at start: {refusal}")


def check_prices(given: list[str], gpus: list[str]) -> None:
    """Each ``--price`` (already parsed) names a GPU kind being planned."""
    catalog = gpu_names()
    for text in given:
        name = text.partition("=")[0].strip()
        if any(price_for({name: 1.0}, gpu) is not None for gpu in gpus):
            continue
        if any(price_for({name: 1.0}, gpu) is not None for gpu in catalog):
            raise InputError(
                f"--price {text}: no GPU kind planned is {name} (planned: {', '.join(gpus)}); "
                f"add --gpu {name} to plan it"
            )
        raise InputError(
            f"--price {text}: {name} names no catalog GPU (`autotune sim catalog` lists them)"
        )


def check_sessions(plan: WorkloadPlan, sessions: int) -> None:
    """``--sessions`` asks for no more sessions at once than the workload has (a request
    outside any session counts as one, as the router hands it out)."""
    have = routed_units(plan)
    if sessions > have:
        raise InputError(
            f"--sessions {sessions}: {plan.name} has {have} sessions, so at most {have} run at "
            f"once; give --sessions {have} or fewer, or a workload with more sessions (e.g. "
            "`autotune workload gen claudecode --sessions N ...`)"
        )
