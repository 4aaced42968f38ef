"""What an OOM launch costs the tuner: the memory edges' retreats, at 8 rows and at 32.

An OOM launch moves the back-off's edge, and the edge search then retreats the best
memory edges the back-off rules out (``tuner/edge.py``): two bisections on the memory
model and up to two replays per edge. ``EDGE_ROWS`` went from 8 to 32 (issue #45); this
times the retreat on the README quick start's lattice (its own spec, ``prepare_study``;
no disk prediction cache), after an OOM at its best-predicted memory edge, as recording
that launch does (``Tuner._back_off``), once with each value in one run. Each row builds
its own tuner (not timed), so no retreat's replay is cached for the other.

    python scripts/bench_edge_retreat.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_warm_start import quick_start_options


def retreat(rows: int, scratch: Path) -> tuple[float, int, int]:
    """Seconds of the back-off at the best edge with ``EDGE_ROWS = rows``; the edges the
    back-off rules out, and the retreats that joined the lattice."""
    import autotune.tuner.edge as edge
    from autotune.study.loop import make_tuner
    from autotune.study.setup import RunOptions, prepare_study

    edge.EDGE_ROWS = rows
    options = quick_start_options(RunOptions, f"sqlite:///{scratch / f'edge-{rows}.db'}")
    spec = prepare_study(options)
    tuner = make_tuner(spec, spec.engine.version())
    guide = tuner.guide
    assert guide is not None
    edges = [c for c in guide.candidates if c.edge]
    best = max(edges, key=lambda c: np.nan_to_num(guide.utility[guide.by_key[c.key]], nan=-9))
    known = len(guide.candidates)
    started = time.monotonic()
    tuner._back_off(best.key, dict(best.params))
    seconds = time.monotonic() - started
    ruled_out = sum(tuner.backoff.presumes_oom(c.memory) for c in edges)
    return seconds, ruled_out, len(guide.candidates) - known


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    os.environ["AUTOTUNE_PREDICTION_CACHE"] = "off"
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        base = retreat(8, Path(scratch))
        ours = retreat(32, Path(scratch))
    print(f"README quick start's lattice, an OOM at its best memory edge (load {load:.1f})")
    print("| edge rows | edges ruled out | retreats joined | seconds | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for rows, (seconds, ruled, joined) in ((8, base), (32, ours)):
        ratio = seconds / base[0] if base[0] else float("nan")
        print(f"| {rows} | {ruled} | {joined} | {seconds:.2f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
