"""Back off after an OOM (``tuner.backoff``): a study on the small space whose truth needs
more memory than the model says (every config predicted to leave under 6% of the card
free runs out of memory), measured in-process by the simulator. Before the back-off the
tuner launched 10 OOMs in 12 trials: each seed it liked sat closer to the edge."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.config.trial_config import TrialConfig
from autotune.study import StudySpec
from autotune.trial.record import TrialRecord
from autotune.trial.run import TrialResult
from autotune.tuner.backoff import BACKOFF
from autotune.tuner.settings import TunerSettings
from autotune.vocabulary import Failure, FailureClass, Outcome
from tests.tuner.conftest import run_small_study

TRUE_EDGE = -0.06  # the truth OOMs where the model predicts less than 6% of the card free


def _measure(spec: StudySpec, config: TrialConfig, log_path: Path, progress: object) -> TrialResult:
    """The simulator's prediction as the measurement, but out of memory past TRUE_EDGE."""
    result = TrialResult(config=config)
    assert spec.prescreen is not None and spec.oracle is not None
    result.memory = spec.prescreen(config)
    assert result.memory is not None
    if not result.memory.fits:
        result.outcome_override = Outcome.PREDICTED_OOM.value
        return result
    prediction = spec.oracle.predict(config)
    assert prediction is not None
    result.argv = ["sim", *config.vllm_args()]
    result.startup, result.server_stats = prediction.startup, prediction.server_stats
    if result.memory.margin >= TRUE_EDGE:
        message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB."
        result.failure = Failure(failure_class=FailureClass.CUDA_OOM_LOAD, message=message)
    else:
        result.failure, result.stats = prediction.failure, prediction.stats
    return result


def _run(tmp_path: Path, trials: int) -> optuna.Study:
    settings = TunerSettings(seed=1)
    return run_small_study(
        tmp_path, measure=_measure, settings=settings, trials=trials, study="backoff"
    )


def _launches(study: optuna.Study) -> list[tuple[float, bool]]:
    """(predicted margin, ran out of memory) of every launch, in order."""
    launched = []
    for trial in study.trials:
        record = TrialRecord.read(trial.user_attrs)
        if record.argv is None or record.outcome == Outcome.PREDICTED_OOM:
            continue
        assert record.memory is not None
        report = record.memory
        headroom = report["headroom_bytes"] - report["load_transient_bytes"]
        oom = record.failure is not None and record.failure.failure_class.is_oom
        launched.append((-headroom / report["visible_bytes"], oom))
    return launched


@pytest.mark.timeout(300)
def test_one_oom_launch_moves_the_edge_for_the_rest_of_the_study_and_its_resume(
    tmp_path: Path,
) -> None:
    study = _run(tmp_path, trials=12)
    launches = _launches(study)
    ooms = [i for i, (_, oom) in enumerate(launches) if oom]
    assert len(ooms) == 1, launches
    edge = launches[ooms[0]][0] - BACKOFF
    assert all(margin < edge for margin, _ in launches[ooms[0] + 1 :]), launches
    assert len(launches) >= 10  # the budget went on launches that ran, not on nothing
    crowned = study.best_trial
    assert TrialRecord.read(crowned.user_attrs).failure is None
    # A resumed run learns the same edge from the stored trials.
    resumed = _launches(_run(tmp_path, trials=18))[len(launches) :]
    assert len(resumed) >= 5 and all(margin < edge and not oom for margin, oom in resumed)
