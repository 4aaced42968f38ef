"""Speed recalibration: the trials' measured throughput, TTFT and TPOT fit the card's
efficiencies, and the tuner re-predicts every config with them (the real Tuner, the real
simulator). The truth here is the simulator on a card whose compute, decode and prefill,
reaches three quarters of what the catalog assumes (cc-traces-24g's truth)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from autotune.config.space import load_space
from autotune.replay.load import LoadSpec
from autotune.sim.model.speed_constants import gpu_constants
from autotune.trial.objective import Goal, ObjectiveName
from autotune.trial.prescreen import make_prescreen
from autotune.trial.record import TrialRecord
from autotune.tuner.lattice import Candidate
from autotune.tuner.predictor import SimOracle
from autotune.tuner.session import Tuner
from autotune.tuner.settings import TunerSettings
from autotune.tuner.speed import NO_STEPS, SpeedFit, base_constants, scaled, with_constants
from autotune.vocabulary import Outcome
from autotune.workload.expand import load_plan

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"  # MTP 0-2, LMCache, KV, seqs
WIDE = REPO / "tests" / "e2e" / "data" / "warm-start.yaml"  # 144 configs: most screened
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
HARDWARE, SIM_MODEL = "rtx4080s-32g", "qwen3.6-27b-awq"
SLOWER = 0.75  # the truth's compute against the catalog's


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
def truth(oracle: SimOracle) -> SimOracle:
    constants = gpu_constants(HARDWARE)
    slower = constants.model_copy(
        update={
            "compute_efficiency": constants.compute_efficiency * SLOWER,
            "prefill_compute_efficiency": constants.prefill_compute_efficiency * SLOWER,
        }
    )
    return with_constants(oracle, slower, "slower compute")


def _tuner(oracle: SimOracle, settings: TunerSettings, space: Path = SMALL) -> Tuner:
    return Tuner(
        settings,
        space=load_space(space),
        model=SIM_MODEL,
        engine_version=None,
        prescreen=make_prescreen(hardware=HARDWARE, sim_model=SIM_MODEL),
        oracle=oracle,
        maximize=True,
        guided=True,
        n_trials=20,
        seed=1,
        cache={},
    )


def _measure(tuner: Tuner, truth: SimOracle, candidate: Candidate, number: int) -> None:
    """Launch ``candidate`` under the truth and record what it measured, as a trial."""
    prediction = truth.predict(candidate.config)
    assert prediction is not None and prediction.failure is None
    value = prediction.stats.output_throughput_tok_s
    record = TrialRecord(
        outcome=Outcome.OK,
        config=candidate.config,
        replay=prediction.stats,
        server_stats=prediction.server_stats,
    )
    trial = optuna.trial.create_trial(
        params=candidate.params,
        distributions=tuner.distributions,
        value=value,
        user_attrs=record.attrs(),
    )
    trial.number = number
    tuner.record(trial, candidate.key, [value], {})


def _throughput(oracle: SimOracle, candidate: Candidate) -> float:
    prediction = oracle.predict(candidate.config)
    assert prediction is not None
    return prediction.stats.output_throughput_tok_s


def test_the_fit_predicts_an_unlaunched_config_as_the_slower_card_runs_it(oracle, truth) -> None:
    candidates = _tuner(oracle, TunerSettings(recalibrate=False)).guide.diverse_top(5)
    launched, unlaunched = candidates[:4], candidates[4]
    fit = SpeedFit(oracle)
    for number, candidate in enumerate(launched):
        prediction = truth.predict(candidate.config)
        fit.observe(number, candidate.config, prediction.stats)
    assert fit.due()
    steps = fit.fit(None)
    assert steps != NO_STEPS
    fitted = with_constants(oracle, scaled(base_constants(oracle), steps), "fitted")
    true = _throughput(truth, unlaunched)
    assert _throughput(oracle, unlaunched) / true - 1 > 0.05  # the catalog's card is faster
    assert abs(_throughput(fitted, unlaunched) / true - 1) < 0.02


def test_noise_alone_does_not_move_the_simulator(oracle) -> None:
    """Figures within a few percent of the simulator's own: the evidence gate keeps it."""
    candidates = _tuner(oracle, TunerSettings(recalibrate=False)).guide.diverse_top(4)
    fit = SpeedFit(oracle)
    offsets = (1.03, 0.97, 1.02, 0.98)
    for number, (candidate, off) in enumerate(zip(candidates, offsets, strict=True)):
        stats = oracle.predict(candidate.config).stats
        noisy = stats.model_copy(
            update={"output_throughput_tok_s": stats.output_throughput_tok_s * off}
        )
        fit.observe(number, candidate.config, noisy)
    assert fit.fit(None) == NO_STEPS


def test_the_tuner_re_predicts_every_config_with_the_measured_speed(oracle, truth) -> None:
    tuner = _tuner(oracle, TunerSettings())
    before = tuner.guide.utility.copy()
    for number, candidate in enumerate(tuner.guide.diverse_top(3)):
        _measure(tuner, truth, candidate, number)
    assert tuner.recalibrate()
    assert "speed" in tuner.recalibration.moved
    mtp = np.array([c.params["mtp_k"] > 0 for c in tuner.guide.candidates])
    changed = ~np.isclose(before, tuner.guide.utility, equal_nan=True)
    assert changed[~mtp].any()  # not only the MTP configs: every config's speed moved
    assert np.nanmax(tuner.guide.utility) < np.nanmax(before)  # the card is slower
    # Switched off, the same measurements leave the configs without MTP as predicted.
    kept = _tuner(oracle, TunerSettings(recalibrate_speed=False))
    for number, candidate in enumerate(kept.guide.diverse_top(3)):
        _measure(kept, truth, candidate, number)
    kept.recalibrate()
    unchanged = np.isclose(before, kept.guide.utility, equal_nan=True)
    assert unchanged[~mtp].all()


def test_after_a_recalibration_every_measured_config_is_judged_by_the_replay(oracle, truth) -> None:
    """The residual compares each measurement with its config's prediction: none of them
    may be left to the screen's score when the guide is re-predicted."""
    tuner = _tuner(oracle, TunerSettings(), WIDE)
    guide = tuner.guide
    ranked = np.argsort(-np.nan_to_num(guide.utility, nan=-np.inf))
    feasible = [int(i) for i in ranked if np.isfinite(guide.utility[i])]
    launched = [guide.candidates[i] for i in (*feasible[:2], feasible[-1])]
    for number, candidate in enumerate(launched):
        _measure(tuner, truth, candidate, number)
    assert tuner.recalibrate()
    replayed = tuner.recalibration.oracle
    for candidate in launched:
        index = guide.by_key[candidate.key]
        assert not guide.screened[index]
        value = replayed.score(candidate.config).values[0]
        assert guide.utility[index] == pytest.approx(np.log(value))
