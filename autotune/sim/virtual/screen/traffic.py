"""The workload as the screen reads it: per request its lengths, wait and dependencies."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from autotune.replay.load import LoadSpec
from autotune.replay.load_policy import LoadPolicy, sessions_in_order
from autotune.sim.model.kv_cache import CACHE_UNIT_MIN_TOKENS
from autotune.sim.model.prompt import PromptRenderer
from autotune.workload.plan import WorkloadPlan


@dataclass(frozen=True)  # frozen: its cached properties are set once, by functools
class Traffic:
    """One entry per request, in send order of the plan (every ``after`` is earlier)."""

    prompt: np.ndarray  # prompt tokens
    output: np.ndarray  # output tokens
    wait: np.ndarray  # seconds after its dependencies end (sessions) or its arrival (trace)
    parents: tuple[tuple[int, ...], ...]  # the requests it waits for
    session: np.ndarray  # index of its session (order of first request)
    mode: str  # the load mode
    slots: int  # concurrency: sessions (or requests) in flight at once
    renderer: PromptRenderer
    plan: WorkloadPlan
    # ``reuse`` by cache unit size, computed once
    reuse_by_unit: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def sessions(self) -> int:
        return int(self.session.max()) + 1 if len(self.session) else 0

    def reuse(self, unit_tokens: int) -> np.ndarray:
        """Per request, the prompt tokens an unbounded prefix cache would hold when it is
        sent (whole cache units of earlier requests' prompts, as the scheduler looks them
        up: never the prompt's last token)."""
        found = self.reuse_by_unit.get(unit_tokens)
        if found is None:
            seen: set[int] = set()
            hits = np.zeros(len(self.prompt))
            for index, request in enumerate(self.plan.requests[: len(self.prompt)]):
                hashes = self.renderer.planned_hashes(request, unit_tokens, salt=None)
                most = (len(self.renderer.planned_array(request)) - 1) // unit_tokens
                count = 0
                for block_hash in hashes[:most]:
                    if block_hash not in seen:
                        break
                    count += 1
                hits[index] = count * unit_tokens
                seen.update(hashes)
            found = self.reuse_by_unit[unit_tokens] = hits
        return found

    @functools.cached_property
    def shared_prefix(self) -> float:
        """Prompt tokens every session starts with (a system prompt), at the finest unit."""
        firsts = [i for i, parents in enumerate(self.parents) if not parents]
        if len(firsts) < 2:
            return 0.0
        return float(np.median(self.reuse(CACHE_UNIT_MIN_TOKENS)[firsts[1:]]))


def read_traffic(plan: WorkloadPlan, load: LoadSpec, renderer: PromptRenderer) -> Traffic:
    """The screen's view of ``plan`` replayed under ``load`` (``max_requests`` honoured)."""
    requests = list(plan.requests)
    if load.max_requests is not None:
        requests = requests[: load.max_requests]
    index = {request.id: i for i, request in enumerate(requests)}
    groups = sessions_in_order(requests)
    session_of = {request.id: s for s, group in enumerate(groups) for request in group}
    policy = LoadPolicy(plan, load.model_copy(update={"mode": "trace"}))  # its wait_s
    parents: list[tuple[int, ...]] = []
    wait = np.zeros(len(requests))
    if load.mode == "trace":
        previous = requests[0].arrival_s if requests else 0.0
        at_s = 0.0
        ordered = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        for i in ordered:
            at_s += policy.wait_s(requests[i].arrival_s - previous)
            previous = requests[i].arrival_s
            wait[i] = at_s
    for i, request in enumerate(requests):
        if load.mode == "sessions":
            parents.append(tuple(index[d] for d in request.after if d in index))
            wait[i] = policy.wait_s(request.gap_s)
        else:
            parents.append(())
    session = (
        np.arange(len(requests))
        if load.mode == "concurrency"
        else np.array([session_of[r.id] for r in requests], dtype=np.int64)
    )
    return Traffic(
        prompt=np.array([len(renderer.planned_array(r)) for r in requests], dtype=np.float64),
        output=np.array([max(1, r.output_tokens) for r in requests], dtype=np.float64),
        wait=wait,
        parents=tuple(parents),
        session=session,
        mode=load.mode,
        slots=load.concurrency,
        renderer=renderer,
        plan=plan,
    )
