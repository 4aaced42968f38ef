"""Back off after an OOM: what the memory model passed and the GPU refused.

The field notes' rule for ``--kv-cache-memory-bytes``: raise until OOM, back off. The
memory pre-screen launches a config whose predicted headroom is positive, however thin;
when the engine runs out of memory all the same (the card's activation peak, CUDA-graph
or per-request memory a few percent above the model's), the model is optimistic by at
least that config's headroom. From then on an unlaunched config predicted to leave less
than that headroom plus ``BACKOFF`` of the card is presumed to OOM too: the tuner does
not propose it (a measured one stays measured; the lattice and the local search skip the
rest). Each further OOM can only lower the floor. Learned from the study's trials, so
workers and a resumed run learn the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.trial.run import MemoryEstimate

# Headroom (share of the card's memory) kept beyond an OOM'd config's: the harsh bench's
# truths put 0.1-0.15% of predicted headroom to OOM and ran configs from 0.2% up.
BACKOFF = 0.005


@dataclass
class MemoryBackoff:
    """The memory margin at or above which an unlaunched config is presumed to OOM."""

    floor: float | None = None  # needed / available - 1 (see ``prescreen.memory_margin``)

    def learn(self, oom_margin: float) -> bool:
        """A launch with this predicted margin ran out of memory; whether the floor fell."""
        floor = oom_margin - BACKOFF
        if self.floor is not None and floor >= self.floor:
            return False
        self.floor = floor
        return True

    def presumes_oom(self, memory: MemoryEstimate | None) -> bool:
        return self.floor is not None and memory is not None and memory.margin >= self.floor

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
