"""Recalibration: a measured MTP trial reports its per-position acceptance, the tuner
re-predicts the MTP configs with it and re-ranks (the real Tuner, the real simulator).

The truth here is the simulator whose second draft is accepted at a tenth of the
catalog's rate (what readme-misled's truth does): the tuner's own simulator ranks MTP 2
first; once a measured MTP 2 trial reports the low acceptance, MTP 1 leads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from autotune.catalog.models import get_model
from autotune.config.space import load_space
from autotune.replay.load import LoadSpec
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.speed_constants import DEFAULT_CONSTANTS
from autotune.trial.objective import Goal, ObjectiveName
from autotune.trial.prescreen import make_prescreen
from autotune.trial.record import TrialRecord
from autotune.tuner.acceptance import THRESHOLD, Observation, pooled
from autotune.tuner.lattice import Candidate
from autotune.tuner.predictor import SimOracle
from autotune.tuner.session import Tuner
from autotune.tuner.settings import TunerSettings
from autotune.vocabulary import Outcome, ServerStats
from autotune.workload.expand import load_plan

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"  # MTP 0-2, LMCache, KV, seqs
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
HARDWARE, SIM_MODEL = "rtx4080s-32g", "qwen3.6-27b-awq"
CATALOG = tuple(get_model(SIM_MODEL).mtp_acceptance_by_kind["agent"])
TRUE_ACCEPTANCE = (CATALOG[0], CATALOG[1] * 0.1)


@pytest.fixture(scope="module")
def oracle() -> SimOracle:
    return SimOracle(
        hardware=HARDWARE,
        sim_model=SIM_MODEL,
        plan=load_plan(WORKLOAD),
        load=LoadSpec(concurrency=4, max_requests=10),
        goal=Goal(objectives=[ObjectiveName.THROUGHPUT], slos=[]),
    )


@pytest.fixture(scope="module")
def cache() -> dict:
    return {}


def _tuner(oracle: SimOracle, cache: dict, settings: TunerSettings) -> Tuner:
    return Tuner(
        settings,
        space=load_space(SMALL),
        model=SIM_MODEL,
        engine_version=None,
        prescreen=make_prescreen(hardware=HARDWARE, sim_model=SIM_MODEL),
        oracle=oracle,
        maximize=True,
        guided=True,
        n_trials=20,
        seed=1,
        cache=cache,
    )


def _best(tuner: Tuner) -> dict:
    """The config the sampler ranks first by its corrected estimate."""
    assert tuner.sampler is not None
    mean, _ = tuner.sampler.estimates()
    return tuner.guide.candidates[int(np.nanargmax(mean))].params


def _measure_top(tuner: Tuner, oracle: SimOracle) -> tuple[int, float]:
    """Launch the predicted best (MTP 2) under the truth; record what it measured."""
    truth = CalibrationProfile(
        constants=DEFAULT_CONSTANTS.model_copy(update={"mtp_acceptance": TRUE_ACCEPTANCE})
    )
    top = tuner.guide.diverse_top(1)[0]
    prediction = SimOracle(**{**oracle.__dict__, "calibration": truth}).predict(top.config)
    assert prediction is not None and prediction.failure is None
    value = prediction.stats.output_throughput_tok_s
    record = TrialRecord(
        outcome=Outcome.OK, replay=prediction.stats, server_stats=prediction.server_stats
    )
    trial = optuna.trial.create_trial(
        params=top.params, distributions=tuner.distributions, value=value, user_attrs=record.attrs()
    )
    tuner.record(trial, top.key, [value], {})
    return tuner.guide.by_key[top.key], value


def test_a_measured_low_acceptance_re_ranks_mtp_1_first(oracle, cache) -> None:
    tuner = _tuner(oracle, cache, TunerSettings())
    assert _best(tuner)["mtp_k"] == 2  # the catalog's acceptance: MTP 2 is predicted best
    before = tuner.guide.utility.copy()
    measured, value = _measure_top(tuner, oracle)
    assert tuner.recalibrate()
    rates = tuner.recalibration.rates
    assert rates[0] == pytest.approx(CATALOG[0], abs=0.03)
    assert rates[1] == pytest.approx(TRUE_ACCEPTANCE[1], abs=0.03)
    assert _best(tuner)["mtp_k"] == 1
    # Only MTP configs were re-predicted, and they went down.
    mtp = np.array([c.params["mtp_k"] > 0 for c in tuner.guide.candidates])
    changed = ~np.isclose(before, tuner.guide.utility, equal_nan=True)
    assert changed[mtp].any() and not changed[~mtp].any()
    assert np.nanmax(
        tuner.guide.utility[
            mtp & np.array([c.params["mtp_k"] == 2 for c in tuner.guide.candidates])
        ]
    ) < np.nanmax(before[mtp])
    # The residual is now taken against the re-predicted value: the measured config's
    # prediction matches its measurement (the truth differs in acceptance alone).
    residual = tuner.sampler.residual_model().predict(tuner.guide.coords[[measured]])[0][0]
    assert abs(residual) < 0.02
    assert abs(tuner.guide.utility[measured] - np.log(value)) < 0.02
    # The same estimate again moves nothing: no second re-prediction.
    assert not tuner.recalibrate()
    # A config refinement added off the lattice is re-predicted too, when the estimate moves.
    top = tuner.guide.candidates[int(np.nanargmax(tuner.guide.utility))]
    off = Candidate({**top.params, "max_num_seqs": 3}, top.config, top.key + " off", top.memory)
    tuner.guide.extend([off], [None], [np.nan])
    tuner.recalibration.observe(
        99, ServerStats(spec_decode_acceptance_per_position=(0.5, 0.05), spec_decode_drafts=10**7)
    )
    assert tuner.recalibrate()
    assert np.isfinite(tuner.guide.utility[-1])


def test_reseeding_replaces_the_seeds_the_recalibration_demoted(oracle, cache) -> None:
    kept, reseeded = (
        _tuner(oracle, cache, TunerSettings(warm_start=3, reseed=reseed))
        for reseed in (False, True)
    )
    before = [seed.key for seed in kept._seeds]
    for tuner in (kept, reseeded):
        _measure_top(tuner, oracle)  # the first seed, MTP 2
        assert tuner.recalibrate()
    assert [seed.key for seed in kept._seeds] == before  # seeds chosen stay
    assert reseeded._seeds[0].key == before[0]  # the launched one stays
    assert any(seed.params["mtp_k"] == 1 for seed in reseeded._seeds[1:])
    assert [seed.key for seed in reseeded._seeds] != before


def test_without_recalibration_the_ranking_stays_the_simulators(oracle, cache) -> None:
    tuner = _tuner(oracle, cache, TunerSettings(recalibrate=False, learn=False))
    before = tuner.guide.utility.copy()
    _measure_top(tuner, oracle)
    assert not tuner.recalibrate()
    assert np.allclose(before, tuner.guide.utility, equal_nan=True)
    assert _best(tuner)["mtp_k"] == 2


def test_acceptance_is_pooled_by_drafts_and_deeper_positions_keep_the_catalogs_decay() -> None:
    prior = (0.9, 0.6, 0.3)
    one = Observation(rates=(0.8,), drafts=300)  # an MTP 1 trial
    two = Observation(rates=(0.5, 0.2), drafts=100)  # an MTP 2 trial
    rates = pooled([one, two], prior)
    assert rates[0] == pytest.approx((0.8 * 300 + 0.5 * 100) / 400, abs=0.005)
    assert rates[1] == pytest.approx(0.2)  # measured by the MTP 2 trial alone
    assert rates[2] == pytest.approx(0.2 * 0.3 / 0.6, abs=0.005)  # the catalog's decay
    assert pooled([one], prior)[1:] == pytest.approx((0.8 * 0.6 / 0.9, 0.8 * 0.3 / 0.9), abs=0.005)


def test_a_position_measured_for_the_first_time_re_predicts_even_a_small_move(
    oracle, cache
) -> None:
    """The first estimate extrapolated position 2 from position 1 (the catalog's decay);
    once an MTP 2 trial measures it, the guide is re-predicted though the mean accepted
    length moved by less than the threshold."""
    tuner = _tuner(oracle, cache, TunerSettings())
    found = tuner.recalibration
    found.observe(
        1, ServerStats(spec_decode_acceptance_per_position=(0.6,), spec_decode_drafts=9000)
    )
    assert tuner.recalibrate()
    assert found.rates[1] == pytest.approx(0.6 * CATALOG[1] / CATALOG[0], abs=0.005)
    found.observe(
        2, ServerStats(spec_decode_acceptance_per_position=(0.6, 0.48), spec_decode_drafts=3000)
    )
    before, after = 1 + sum(found.rates), 1 + sum(found.estimate())
    assert abs(after - before) / before < THRESHOLD
    assert tuner.recalibrate() and found.rates[1] == pytest.approx(0.48)
    assert not tuner.recalibrate()


def test_acceptance_a_few_percent_off_the_catalog_re_predicts(oracle, cache) -> None:
    """A measured mean accepted length 5% under the catalog's is worth re-ranking for:
    the simulator's predictions move with the acceptance, not with a reshuffle of draws."""
    tuner = _tuner(oracle, cache, TunerSettings())
    rates = tuple(rate * 0.93 for rate in CATALOG[:2])
    moved = (sum(CATALOG[:2]) - sum(rates)) / (1 + sum(CATALOG[:2]))
    assert 0.04 < moved < 0.06
    tuner.recalibration.observe(
        1, ServerStats(spec_decode_acceptance_per_position=rates, spec_decode_drafts=9000)
    )
    assert tuner.recalibrate()
    assert tuner.recalibration.rates[:2] == pytest.approx(rates, abs=0.005)


def _next_launch(tuner: Tuner) -> dict:
    """What the tuner launches next (an empty study: no tail, no racing yet)."""
    study = optuna.create_study(direction="maximize")
    trial = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING)
    role = tuner.next_role(study, trial)
    assert role is not None
    return role.params


@pytest.mark.parametrize("overtake", [True, False])
def test_once_a_seed_is_measured_a_config_ranked_above_the_seeds_left_goes_first(
    oracle, cache, overtake: bool
) -> None:
    """The first seed (MTP 2) measures the low acceptance; recalibration ranks MTP 1
    first. With overtaking the best estimate, an MTP 1 config that is not a seed, launches
    next; without, the second seed does (MTP 2)."""
    tuner = _tuner(oracle, cache, TunerSettings(warm_start=2, overtake=overtake))
    seeds = [seed.params for seed in tuner._seeds]
    assert [params["mtp_k"] for params in seeds] == [2, 2]
    _measure_top(tuner, oracle)
    assert tuner.recalibrate()
    launched = _next_launch(tuner)
    if overtake:
        assert launched["mtp_k"] == 1
        mean, _ = tuner.sampler.estimates()
        chosen = next(i for i, c in enumerate(tuner.guide.candidates) if c.params == launched)
        assert mean[chosen] == pytest.approx(np.nanmax(mean))
    else:
        assert launched == seeds[1]
