"""The memory edge located after an OOM (``tuner.edge``): on the 24 GB long-context
corner (2.5 GiB of KV beside LMCache, max-num-seqs 1 to 8), an edge launched out of memory
moves the back-off past every edge at once; the best ones retreat to the largest chunk
that the back-off allows, which the replay rates far above the lattice point below."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.study import StudySpec
from autotune.tuner.guide import SAME_PREDICTION
from autotune.tuner.settings import TunerSettings
from tests.tuner.conftest import DATA, guided_tuner, longctx_spec

CHUNK = "max_num_batched_tokens"


@pytest.fixture(scope="module")
def edge_case(tmp_path_factory: pytest.TempPathFactory) -> StudySpec:
    return longctx_spec(tmp_path_factory, DATA / "edge-longctx.yaml")


def _row(params: dict) -> dict:
    return {k: v for k, v in params.items() if k != CHUNK}


def test_an_oom_at_the_best_memory_edge_moves_it_below_the_back_off_s_edge(
    edge_case: StudySpec,
) -> None:
    tuner = guided_tuner(edge_case, {}, TunerSettings(), n_trials=20)
    guide, sampler = tuner.guide, tuner.sampler
    assert guide is not None and sampler is not None
    edges = [c for c in guide.candidates if c.edge]
    best = max(edges, key=lambda c: np.nan_to_num(guide.utility[guide.by_key[c.key]], nan=-9))
    known = len(guide.candidates)
    tuner._back_off(best.key, dict(best.params))  # what recording its OOM launch does
    assert all(tuner.backoff.presumes_oom(c.memory) for c in edges)  # every edge at once
    moved = guide.candidates[known:]
    (retreat,) = [c for c in moved if _row(c.params) == _row(best.params)]
    below = next(
        c for c in guide.candidates if c.params == {**best.params, CHUNK: 1024}
    )  # the row's lattice point under the edge
    assert below.params[CHUNK] < retreat.params[CHUNK] < best.params[CHUNK]
    assert retreat.edge and retreat.memory is not None
    assert retreat.memory.margin < tuner.backoff.floor  # what the back-off allows
    utility = guide.utility[guide.by_key[retreat.key]]
    assert np.exp(utility - tuner.refiner.predicted(below)) > 1.25  # the jump the edge holds
    assert guide.screened is not None and not guide.screened[guide.by_key[retreat.key]]
    pick = sampler._pick()
    assert pick is not None and guide.candidates[pick].key in {c.key for c in moved}


def test_without_the_edge_search_an_oom_at_the_edge_leaves_only_the_lattice_below(
    edge_case: StudySpec,
) -> None:
    tuner = guided_tuner(edge_case, {}, TunerSettings(edge_search=False), n_trials=20)
    guide = tuner.guide
    assert guide is not None
    best = max(
        (c for c in guide.candidates if c.edge),
        key=lambda c: np.nan_to_num(guide.utility[guide.by_key[c.key]], nan=-9),
    )
    known = len(guide.candidates)
    tuner._back_off(best.key, dict(best.params))
    assert len(guide.candidates) == known


def test_after_an_oom_every_edge_row_the_back_off_rules_out_retreats(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Not only the best-estimated few: the residual learned from the first launches can
    rank the row that holds the best config low (the memory-edge bench's band, MTP 2
    beside two seats, past the eighth after one run of a seed fell 12% short)."""
    spec = longctx_spec(tmp_path_factory, DATA / "edge-rows.yaml")
    tuner = guided_tuner(spec, {}, TunerSettings(), n_trials=20)
    guide = tuner.guide
    assert guide is not None and tuner.edges is not None
    edges = [c for c in guide.candidates if c.edge]
    best = max(edges, key=lambda c: np.nan_to_num(guide.utility[guide.by_key[c.key]], nan=-9))
    tuner._back_off(best.key, dict(best.params))
    ruled_out = [c for c in edges if tuner.backoff.presumes_oom(c.memory)]
    assert len(ruled_out) > 16  # the rows the space holds, past every edge at once
    retreated = [guide.utility[guide.by_key[key]] for key in tuner.edges.retreated]
    for edge in ruled_out:  # retreated, or predicted alike one that was
        utility = guide.utility[guide.by_key[edge.key]]
        assert min(abs(utility - u) for u in retreated) < SAME_PREDICTION, edge.params
