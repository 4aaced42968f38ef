"""A warm-start seed alike a config already launched is not launched: it would measure
the same behaviour again (cc-traces-24g launched 2.5 GiB of fp8 e5m2 KV, 16 seats,
1,858 tokens by overtaking, then the same config with fp8 e4m3 as its fourth seed: one
launch of 30 spent where the simulator said nothing new would be learned)."""

from __future__ import annotations

import optuna

from autotune.trial.record import TrialRecord
from autotune.tuner.lattice import Candidate
from autotune.tuner.predictor import SimOracle
from autotune.tuner.session import Tuner
from autotune.tuner.settings import TunerSettings
from autotune.vocabulary import Outcome
from tests.tuner.test_recalibration import _tuner, cache, oracle  # noqa: F401  (fixtures)


def _launch(tuner: Tuner, oracle: SimOracle, candidate: Candidate) -> None:  # noqa: F811
    """``candidate`` launched and measured as the simulator predicts it."""
    prediction = oracle.predict(candidate.config)
    assert prediction is not None and prediction.failure is None
    value = prediction.stats.output_throughput_tok_s
    trial = optuna.trial.create_trial(
        params=candidate.params,
        distributions=tuner.distributions,
        value=value,
        user_attrs=TrialRecord(outcome=Outcome.OK, replay=prediction.stats).attrs(),
    )
    tuner.record(trial, candidate.key, [value], {})


def test_a_seed_alike_a_launched_config_is_passed_over(oracle, cache) -> None:  # noqa: F811
    tuner = _tuner(oracle, cache, TunerSettings(warm_start=2, overtake=False))
    assert tuner.guide is not None
    first, second = tuner._seeds
    alike = tuner.guide.equivalent_to({second.key})
    twin = next(
        c
        for i, c in enumerate(tuner.guide.candidates)
        if alike[i] and c.key not in (first.key, second.key)
    )
    _launch(tuner, oracle, first)
    _launch(tuner, oracle, twin)
    study = optuna.create_study(direction="maximize")
    running = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING)
    role = tuner.next_role(study, running)
    # Not the second seed: the guided sampler's pick (no role) takes its turn.
    assert role is None or role.params != second.params
    assert tuner.sampler is not None and tuner.sampler._pick() is not None
