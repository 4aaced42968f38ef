"""Off-lattice refinement on the real simulator: a small 24 GB long-context case where the
lattice (max-num-seqs 1, 2, 4, 8) misses the predicted best (max-num-seqs 3)."""

from __future__ import annotations

import numpy as np
import optuna

from autotune.study import StudySpec
from autotune.tuner.guide import Guide, build_guide
from autotune.tuner.refine import PREDICTIONS, Refinement, Refiner
from autotune.tuner.residual import ResidualModel
from autotune.tuner.session import Tuner
from autotune.tuner.settings import TunerSettings
from tests.tuner.conftest import guided_tuner


def _refined(spec: StudySpec, cache: dict) -> tuple[Guide, Refinement, int]:
    common = dict(
        model=spec.model, engine_version=None, prescreen=spec.prescreen, oracle=spec.oracle
    )
    guide = build_guide(spec.space, maximize=True, cache=cache, **common)
    lattice = len(guide.candidates)
    done = Refiner(spec.space, maximize=True, cache=cache, **common).refine(guide)
    return guide, done, lattice


def test_refinement_finds_a_predicted_better_config_between_the_lattice_points(case) -> None:
    spec, cache = case
    guide, done, lattice = _refined(spec, cache)
    lattice_best = np.nanmax(guide.utility[:lattice])
    best = int(np.nanargmax(guide.utility))
    assert best >= lattice, "the predicted best is a refined config"
    assert guide.utility[best] > lattice_best
    assert guide.candidates[best].params["max_num_seqs"] == 3  # between the ladder's 2 and 4
    assert done.gain > 1.0 and done.added == len(guide.candidates) - lattice
    assert 0 < done.predictions <= PREDICTIONS


def test_refined_configs_respect_bounds_rules_grid_and_the_prescreen(case) -> None:
    spec, cache = case
    guide, _, lattice = _refined(spec, cache)
    refined = guide.candidates[lattice:]
    assert refined
    distributions = spec.space.distributions(None)
    keys = [c.key for c in guide.candidates]
    assert len(keys) == len(set(keys)), "one candidate per effective launch"
    for candidate in refined:
        for name, value in candidate.params.items():
            dist = distributions[name]
            assert dist._contains(dist.to_internal_repr(value)), (name, value)  # bounds, step
        assert not spec.space.rule_violations(candidate.params)
        assert candidate.memory is not None and candidate.memory.fits
        assert spec.prescreen(candidate.config).fits
        assert np.isfinite(guide.utility[keys.index(candidate.key)])
    # the pre-screen caps batched tokens at this KV pool: 2048 (on the lattice) does not fit
    assert max(c.params["max_num_batched_tokens"] for c in refined) < 2048


def test_the_tuner_refines_after_a_measurement_unless_switched_off(case) -> None:
    spec, cache = case

    def measured_once(settings: TunerSettings) -> Tuner:
        tuner = guided_tuner(spec, cache, settings, 10)
        assert tuner.guide is not None
        best = tuner.guide.diverse_top(1)[0]  # the warm start's first seed: on the lattice
        assert best.params["max_num_seqs"] == 2
        trial = optuna.trial.create_trial(
            params=best.params,
            distributions=tuner.distributions,
            value=50.0,  # below its prediction: the residual is learned from it
            user_attrs={"measured": True},
        )
        tuner.record(trial, best.key, [50.0], {})
        return tuner

    on, off = measured_once(TunerSettings()), measured_once(TunerSettings(refine=False))
    lattice = len(off.guide.candidates)
    assert on.refine() > 0 and off.refine() == 0
    assert len(on.guide.candidates) > lattice == len(off.guide.candidates)
    for candidate in on.guide.candidates[lattice:]:  # params Optuna takes as they are
        for name, value in candidate.params.items():
            dist = on.distributions[name]
            assert dist._contains(dist.to_internal_repr(value))


def test_a_learned_trend_leads_the_refinement_up_to_the_prescreens_edge(case) -> None:
    """Measurements that say larger batched tokens run better than predicted (a residual
    rising along that knob) move the climb up to the largest value that still fits."""
    spec, cache = case
    common = dict(
        model=spec.model, engine_version=None, prescreen=spec.prescreen, oracle=spec.oracle
    )
    guide = build_guide(spec.space, maximize=True, cache=cache, **common)
    base = dict(guide.candidates[int(np.nanargmax(guide.utility))].params)
    rows = [guide.encode({**base, "max_num_batched_tokens": n}) for n in (1024, 2048, 4096)]
    residual = ResidualModel(np.array(rows), np.array([-0.3, 0.0, 0.3]))
    before = len(guide.candidates)
    Refiner(spec.space, maximize=True, cache=cache, **common).refine(guide, residual)
    tokens = [c.params["max_num_batched_tokens"] for c in guide.candidates[before:]]
    assert tokens and max(tokens) > 1100  # the lattice has 1024 only, 2048 does not fit
    for candidate in guide.candidates[before:]:
        assert spec.prescreen(candidate.config).fits
        wider = {**candidate.params, "max_num_batched_tokens": round(max(tokens) * 1.05)}
        assert not spec.prescreen(spec.space.to_config(wider, model=spec.model)).fits
