"""Back off after an OOM: what the memory model passed and the GPU refused.

The field notes' rule for ``--kv-cache-memory-bytes``: raise until OOM, back off. The
memory pre-screen launches a config whose predicted headroom is positive, however thin;
when the engine runs out of memory all the same (the card's activation peak, CUDA-graph
or per-request memory a few percent above the model's), the model is optimistic by at
least that config's headroom. From then on an unlaunched config predicted to leave less
than that headroom plus ``BACKOFF`` of the card is presumed to OOM too: the tuner does
not propose it (a measured one stays measured; the lattice and the local search skip the
rest). Each further OOM can only lower the floor. A launch that ran bounds the edge from
the other side: a config the model says needs no more than it of any kind of memory
(weights, activations, CUDA graphs, LMCache, the KV pool, each load-time transient) and
leaves at least its headroom cannot run out where it did not, so it is never presumed to
OOM (on README adverse one OOM of a large chunk had ruled out every neighbour of the
leader, max-num-seqs 6 beside the 8 that ran among them). Learned from the study's
trials, so workers and a resumed run learn the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.trial.run import MemoryEstimate

# Headroom (share of the card's memory) kept beyond an OOM'd config's: the harsh bench's
# truths put 0.1-0.15% of predicted headroom to OOM and ran configs from 0.2% up.
BACKOFF = 0.005
# What a config needs, by kind (``MemoryEstimate.report`` keys, bytes): a config needing no
# more of each than one that ran, and leaving no less headroom, fits where it did.
NEEDS = (
    "weights_bytes",
    "peak_activation_bytes",
    "non_torch_bytes",
    "cudagraph_bytes",
    "lmcache_bytes",
    "kv_cache_bytes",
    "load_transient_bytes",
)


@dataclass
class MemoryBackoff:
    """The memory margin at or above which an unlaunched config is presumed to OOM."""

    floor: float | None = None  # needed / available - 1 (see ``prescreen.memory_margin``)
    ran: list[tuple[float, ...]] = field(default_factory=list)  # ``_needs`` of launches that ran

    def learn(self, oom_margin: float) -> bool:
        """A launch with this predicted margin ran out of memory; whether the floor fell."""
        floor = oom_margin - BACKOFF
        if self.floor is not None and floor >= self.floor:
            return False
        self.floor = floor
        return True

    def learn_ran(self, memory: MemoryEstimate) -> None:
        """A launch with this estimate ran its whole replay without running out of memory."""
        needs = _needs(memory)
        if needs is not None and needs not in self.ran:
            self.ran.append(needs)

    def presumes_oom(self, memory: MemoryEstimate | None) -> bool:
        return bool(self.presumed([memory])[0])

    def presumed(self, memories: Sequence[MemoryEstimate | None]) -> np.ndarray:
        """Mask of ``memories`` presumed to OOM: past the floor and needing more of some
        kind of memory than every launch that ran (``NEEDS``)."""
        past = np.array(
            [m is not None and self.floor is not None and m.margin >= self.floor for m in memories],
            dtype=bool,
        )
        if not self.ran or not past.any():
            return past
        found = {i: _needs(memories[i]) for i in np.flatnonzero(past)}  # type: ignore[arg-type]
        rows = [i for i, needs in found.items() if needs is not None]
        if rows:
            needs = np.array([found[i] for i in rows])
            covered = (needs[:, None, :] <= np.array(self.ran)[None]).all(axis=2).any(axis=1)
            past[np.array(rows)[covered]] = False
        return past

    def describe(self) -> str:
        assert self.floor is not None
        edge = (
            f"to leave less than {-self.floor:.1%} of the GPU's memory free"
            if self.floor < 0
            else f"to need more than {self.floor:.1%} over the GPU's memory"
        )
        return (
            "A launch ran out of memory that the memory model said would fit: configs "
            f"predicted {edge} are presumed to OOM and not launched"
        )


def _needs(memory: MemoryEstimate) -> tuple[float, ...] | None:
    """The memory ``memory`` says a config needs, by kind (``NEEDS``), and its margin;
    None when the estimate lacks one of them."""
    report = memory.report
    if any(not isinstance(report.get(name), int | float) for name in NEEDS):
        return None
    seats = report.get("transient_bytes_per_seq", 0.0) * report.get("max_num_seqs", 0)
    return (*(float(report[name]) for name in NEEDS), float(seats), memory.margin)
