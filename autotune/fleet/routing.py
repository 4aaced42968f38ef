"""The fleet's router, stated: sessions round robin over the replicas.

Session k of the workload (in order of first arrival) goes to replica k mod R, and every
request of a session follows it (its prefix cache stays on one replica); an independent
request (no session) goes by its own index the same way. The target load is shared the
same way: ``--sessions N`` gives replica r N // R sessions at once, one more for the first
N mod R; a trace keeps its recorded arrivals (sped up alike on every replica). The
replicas are independent servers, so a fleet's replay is the replicas' replays side by
side: what `autotune plan` predicts and what the fleet test replays on real processes.
"""

from __future__ import annotations

import dataclasses

from autotune.replay.load import LoadSpec
from autotune.workload.plan import WorkloadPlan


def replica_of_requests(plan: WorkloadPlan, replicas: int) -> list[int]:
    """For each request of ``plan``, the replica it is routed to."""
    session_index = {session: index for index, session in enumerate(plan.sessions)}
    routed = []
    independent = 0
    for request in plan.requests:
        if request.session is None:
            routed.append(independent % replicas)
            independent += 1
        else:
            routed.append(session_index[request.session] % replicas)
    return routed


def split_plan(plan: WorkloadPlan, replicas: int) -> list[WorkloadPlan]:
    """``plan``'s requests as each of ``replicas`` replicas receives them (module docstring)."""
    routed = replica_of_requests(plan, replicas)
    return [
        dataclasses.replace(
            plan,
            name=f"{plan.name}@{replica + 1}of{replicas}",
            requests=tuple(r for r, to in zip(plan.requests, routed, strict=True) if to == replica),
        )
        for replica in range(replicas)
    ]


def split_load(load: LoadSpec, replicas: int) -> list[LoadSpec]:
    """Each replica's share of ``load``: its sessions (or requests) at once; a trace as is."""
    if load.mode == "trace":
        return [load] * replicas
    base, extra = divmod(load.concurrency, replicas)
    return [
        load.model_copy(update={"concurrency": max(1, base + (1 if r < extra else 0))})
        for r in range(replicas)
    ]


def routed_units(plan: WorkloadPlan) -> int:
    """What the router hands out: the sessions and the independent requests."""
    return len(plan.sessions) + sum(1 for r in plan.requests if r.session is None)


def most_replicas(plan: WorkloadPlan, load: LoadSpec) -> int:
    """The most replicas the load can keep busy: one session (or request) each."""
    units = routed_units(plan)
    if load.mode == "trace":
        return max(1, units)
    return max(1, min(units, load.concurrency))


def scaled(load: LoadSpec, factor: float) -> LoadSpec:
    """``load`` ``factor`` times heavier: more sessions at once, or a faster trace."""
    if load.mode == "trace":
        return load.model_copy(update={"timing_scale": load.timing_scale * factor})
    return load.model_copy(update={"concurrency": max(1, round(load.concurrency * factor))})


def describe(load: LoadSpec) -> str:
    """The load in the user's words: ``40 sessions at once`` or ``the trace at 2x``."""
    if load.mode == "trace":
        return f"the trace at {load.timing_scale:g}x"
    unit = "sessions" if load.mode == "sessions" else "requests"
    return f"{load.concurrency} {unit} at once"
