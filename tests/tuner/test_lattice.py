"""The lattice of effective configs, its deduplication, and the diverse warm-start pick."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna

from autotune.config.space import SEARCH_SPACES_DIR, load_space
from autotune.trial.prescreen import make_prescreen
from autotune.tuner.guide import MIN_SEED_DISTANCE, Guide, make_encoder
from autotune.tuner.lattice import config_key, enumerate_effective, ladder, lattice_params

DATA = Path(__file__).resolve().parents[1] / "e2e" / "data"
QWEN = SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml"


def test_ladders_take_every_choice_powers_of_two_and_step_aligned_points() -> None:
    dists = optuna.distributions
    assert ladder(dists.CategoricalDistribution(["a", "b"])) == ["a", "b"]
    assert ladder(dists.IntDistribution(1, 64, log=True)) == [1, 2, 4, 8, 16, 32, 64]
    assert ladder(dists.IntDistribution(3, 20, log=True)) == [3, 4, 8, 16, 20]
    kv = ladder(dists.FloatDistribution(6.0, 13.0, step=0.25))
    assert kv[0] == 6.0 and kv[-1] == 13.0 and len(kv) <= 9
    assert all(abs(v * 4 - round(v * 4)) < 1e-9 for v in kv)  # on the space's step
    assert ladder(dists.IntDistribution(0, 3)) == [0, 1, 2, 3]


def test_configs_that_derived_rules_make_identical_are_one_launch() -> None:
    space = load_space(DATA / "tuner-dedup.yaml")
    points = lattice_params(space, None)
    prescreen = make_prescreen(hardware="rtx4080s-32g", sim_model="qwen3.6-27b-awq")
    # The memory model supplies N (the attention block size) that the 2N-1 rule needs.
    candidates = enumerate_effective(
        space, model="qwen3.6-27b-awq", engine_version=None, prescreen=prescreen
    )
    assert len(points) == 6
    # LMCache on with MTP: 2N-1 replaces all three limits -> 3 (off) + 1 (on) launches.
    assert len(candidates) == 4
    assert len({c.key for c in candidates}) == 4
    with_lmcache = [c for c in candidates if c.params["lmcache"]]
    assert len(with_lmcache) == 1


def test_the_shipped_space_dedups_and_the_prescreen_attaches_memory() -> None:
    space = load_space(QWEN)
    prescreen = make_prescreen(
        hardware="rtx4080s-32g", sim_model="qwen3.6-27b-awq", max_prompt_tokens=20_000
    )
    candidates = enumerate_effective(
        space, model="qwen3.6-27b-awq", engine_version=None, prescreen=prescreen
    )
    assert len(candidates) < len(lattice_params(space, None))
    assert all(c.memory is not None for c in candidates)
    fits = [c for c in candidates if c.memory.fits]
    assert 0 < len(fits) < len(candidates)
    assert config_key(candidates[0].config) == candidates[0].key


def test_the_warm_start_pick_is_best_first_and_diverse() -> None:
    space = load_space(DATA / "tuner-small.yaml")
    candidates = enumerate_effective(space, model="qwen3.6-27b-awq", engine_version=None)
    encode = make_encoder(space, None)
    coords = np.array([encode(c.params) for c in candidates])
    # Utility: MTP k dominates; near-ties differ only in the KV pool.
    utility = np.array(
        [c.params["mtp_k"] + 0.01 * c.params["kv_cache_memory_gib"] for c in candidates]
    )
    guide = Guide(candidates=candidates, utility=utility, coords=coords, encode=encode)
    picked = guide.diverse_top(3)
    assert picked[0].params["mtp_k"] == 2 and picked[0].params["kv_cache_memory_gib"] == 9.0
    for i, a in enumerate(picked):
        for b in picked[i + 1 :]:
            assert np.linalg.norm(encode(a.params) - encode(b.params)) >= MIN_SEED_DISTANCE
    assert len({c.key for c in picked}) == 3
    excluded = guide.diverse_top(1, exclude={picked[0].key})
    assert excluded[0].key != picked[0].key
