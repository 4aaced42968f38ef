"""An interrupt while Optuna creates the next trial (before the objective runs) is
recorded like one during a trial: no trial is left RUNNING, and an enqueued config
is enqueued again. CI once saw a kill -9 of `run --gpus` leave a worker's trial
RUNNING: the worker's SIGTERM arrived in that gap."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.replay.load import LoadSpec
from autotune.study import run_study
from autotune.study.setup import RunOptions, prepare_study
from autotune.trial.record import TrialRecord
from autotune.tuner.settings import TunerSettings
from autotune.vocabulary import Outcome
from tests.e2e.conftest import SAMPLE_WORKLOAD

FITS_SPACE = Path(__file__).with_name("data") / "fits.yaml"


class InterruptedWhileCreated(optuna.samplers.RandomSampler):
    """Optuna's random sampler; the signal arrives as the given trial is created (it is
    already RUNNING in storage, the objective not yet called)."""

    def __init__(self, number: int, signum: int) -> None:
        super().__init__(seed=1)
        self.number, self.signum = number, signum

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.number == self.number:
            os.kill(os.getpid(), self.signum)
        super().before_trial(study, trial)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # what the CLI does on SIGTERM


@pytest.mark.parametrize(("number", "signum"), [(0, signal.SIGTERM), (1, signal.SIGINT)])
@pytest.mark.timeout(120)
def test_an_interrupt_as_a_trial_is_created_leaves_no_trial_running(
    tmp_path: Path, number: int, signum: int
) -> None:
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    storage = f"sqlite:///{tmp_path / 'a.db'}"
    options = RunOptions(
        workload=SAMPLE_WORKLOAD, model="qwen3.6-27b-awq", hardware="rtx4080s-32g",
        space=FITS_SPACE, storage=storage, study="gap", trials=3, sampler="random",
        load=LoadSpec(max_requests=8, concurrency=4), time_scale=50,
        tuner=TunerSettings(warm_start=0, confirm=0, seed=1),
    )  # fmt: skip
    spec = dataclasses.replace(
        prepare_study(options), sampler=InterruptedWhileCreated(number, signum)
    )
    try:
        with pytest.raises(KeyboardInterrupt):
            run_study(spec)
    finally:
        signal.signal(signal.SIGTERM, previous)
    trials = optuna.load_study(study_name="gap", storage=storage).get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    interrupted = trials[number]
    assert interrupted.state == TrialState.FAIL
    assert TrialRecord.read(interrupted.user_attrs).outcome == Outcome.INTERRUPTED
    if number == 0:  # the enqueued baseline was interrupted: it waits to run again
        waiting = [t for t in trials if t.state == TrialState.WAITING]
        assert [TrialRecord.read(t.user_attrs).retry_of for t in waiting] == [0]
        assert TrialRecord.read(waiting[0].user_attrs).is_baseline
