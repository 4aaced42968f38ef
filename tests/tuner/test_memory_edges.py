"""The chunk's memory edges in the lattice: where 1,024 batched tokens fit and 2,048 do
not, the largest chunk between them that the pre-screen passes (the field notes' "raise
until OOM, back off", on the memory model). On a 24 GB card with Claude Code traffic up
to 60k context and 2.5 GiB of KV beside LMCache, the simulator jumps from 30-35 tok/s to
over 50 between 1,568 and 1,600 batched tokens: the edge runs far faster than any
lattice point."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.study import StudySpec
from autotune.trial.run import derive_config
from autotune.tuner.guide import build_guide
from autotune.tuner.lattice import EDGE_RESOLUTION, enumerate_effective, ladder
from tests.tuner.conftest import DATA, longctx_spec

CHUNK = "max_num_batched_tokens"


@pytest.fixture(scope="module")
def edge_case(tmp_path_factory: pytest.TempPathFactory) -> StudySpec:
    return longctx_spec(tmp_path_factory, DATA / "edge-longctx.yaml")


def _fits(spec: StudySpec, params: dict, *, every_seat: bool = False) -> bool:
    """Whether the pre-screen passes ``params``; ``every_seat``: with room left for the
    sampler buffers of every seat beside the chunk (the worst step), not one seat's."""
    config = derive_config(
        spec.space, params, model=spec.model, engine_version=None, prescreen=spec.prescreen
    )
    memory = spec.prescreen(config)
    if not every_seat or not memory.fits:
        return memory.fits
    report = memory.report
    seats = (report["max_num_seqs"] - 1) * report["transient_bytes_per_seq"]
    return report["headroom_bytes"] - report["load_transient_bytes"] >= seats


def test_each_row_holds_the_largest_chunk_that_fits_between_two_lattice_points(
    edge_case: StudySpec,
) -> None:
    spec = edge_case
    chunks = ladder(spec.space.distributions(None)[CHUNK])
    candidates = enumerate_effective(
        spec.space, model=spec.model, engine_version=None, prescreen=spec.prescreen
    )
    off_lattice = [c for c in candidates if c.params[CHUNK] not in chunks]
    rows = {c.params["max_num_seqs"] for c in candidates}
    assert rows == {1, 2, 4, 8}
    for seqs in rows:
        lattice = {"kv_cache_memory_gib": 2.5, "kv_cache_dtype": "fp8_e4m3", "lmcache": True}
        assert _fits(spec, {**lattice, "max_num_seqs": seqs, CHUNK: 1024})
        assert not _fits(spec, {**lattice, "max_num_seqs": seqs, CHUNK: 2048})
        (edge,) = [c for c in off_lattice if c.params["max_num_seqs"] == seqs]
        assert 1024 < edge.params[CHUNK] < 2048
        assert edge.memory is not None and edge.memory.fits
        assert _fits(spec, edge.params, every_seat=True)
        past = math.ceil(edge.params[CHUNK] * (1 + EDGE_RESOLUTION))
        assert not _fits(spec, {**edge.params, CHUNK: past}, every_seat=True)


def test_the_warm_start_ranks_the_edge_above_every_lattice_point(edge_case: StudySpec) -> None:
    spec = edge_case
    assert spec.oracle is not None
    guide = build_guide(
        spec.space,
        model=spec.model,
        engine_version=None,
        prescreen=spec.prescreen,
        oracle=spec.oracle,
        maximize=True,
    )
    chunks = ladder(spec.space.distributions(None)[CHUNK])
    on_lattice = [
        u for c, u in zip(guide.candidates, guide.utility, strict=True) if c.params[CHUNK] in chunks
    ]
    best = guide.candidates[int(np.nanargmax(guide.utility))]
    assert best.params[CHUNK] not in chunks
    # Past the tails' one-chunk threshold: 1.35x the best lattice point's prediction.
    assert math.exp(np.nanmax(guide.utility) - np.nanmax(on_lattice)) > 1.25


def test_every_edge_runs_in_the_replay_beside_a_full_chunk_for_every_seat(
    edge_case: StudySpec,
) -> None:
    """The pre-screen counts one seat's sampler buffers beside the chunk; the engine may
    schedule every seat with it. An edge bisected to the pre-screen's limit ran out of
    memory in the replay in the rows of 4 and 8 seats: the lattice held a config its own
    simulator predicts to die, where the chunk's gain lies."""
    spec = edge_case
    assert spec.oracle is not None
    edges = [
        c
        for c in enumerate_effective(
            spec.space, model=spec.model, engine_version=None, prescreen=spec.prescreen
        )
        if c.edge
    ]
    assert {c.params["max_num_seqs"] for c in edges} == {1, 2, 4, 8}
    for edge in edges:
        prediction = spec.oracle.predict(edge.config)
        assert prediction is not None and prediction.failure is None, edge.params


def test_the_warm_start_replays_every_memory_edge_whatever_the_screen_says(
    edge_case: StudySpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where memory is tight the screen is blind (no preemption, no thrash): the replay
    judges every edge beside a short list of one."""
    from autotune.tuner import two_tier

    monkeypatch.setattr(two_tier, "SHORTLIST_MIN", 1)
    monkeypatch.setattr(two_tier, "CLIMB_MIN", 0)
    spec = edge_case
    assert spec.oracle is not None
    candidates = enumerate_effective(
        spec.space, model=spec.model, engine_version=None, prescreen=spec.prescreen
    )
    cache: dict = {}
    tiers = two_tier.predict_two_tier(spec.oracle, candidates, cache, maximize=True)
    edges = [c for c in candidates if c.edge]
    assert tiers.edges == len(edges) == 4
    assert all(c.key in cache for c in edges)
