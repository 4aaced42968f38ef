"""The screen: every config of a lattice scored at once from the workload's statistics.

The replay (``virtual/predict.py``) steps the scheduler through every request of the
workload, tens of milliseconds a config; the screen answers the same question in well
under a millisecond a config, so that a lattice of thousands is scored whole and the
replay judges only the short list the screen ranks at the top
(``autotune/tuner/two_tier.py``). It uses the replay's own parts: the memory plan
(``plan_memory``: KV blocks, seats, run-time headroom), the step-cost model
(``RooflineTimeModel``: decode steps by batch, prefill chunks by size), MTP acceptance
(the same per-position rates) and chunked prefill; what it drops is the step-by-step
schedule. In its place, a request-level queue in modelled time, computed for a block of
configs at once as numpy arrays (``queue.py``): each request takes a seat, waits for room
in the KV pool for its context, has its uncached prompt prefilled in chunks (one prefill
at a time), then decodes at the pace its steps allow (``pace.py``: a step beside a prefill
chunk takes the chunk's time). The queue runs a few passes; each takes from the last one
what depends on the whole schedule (the decode batch, the prefills beside each decode,
what the pool's LRU still holds of a session's prefix).

Modules: ``traffic.py`` (the workload as the screen reads it), ``terms.py`` (each
config's constants from the replay's models), ``queue.py``, ``pace.py``, ``figures.py``
(a replay's stats from the queue's arrays), ``run.py`` (``screen``: configs in, figures
out). The figures are a ranking, not a measurement: ``scripts/bench_screen.py`` measures
their rank correlation with the replay and whether the replay's best is inside the
screen's short list, on every landscape of the tuner's benchmark and GPU of the plan.
"""

from autotune.sim.virtual.screen.run import Screened, screen

__all__ = ["Screened", "screen"]
