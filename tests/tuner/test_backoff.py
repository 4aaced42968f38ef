"""Back off after an OOM (``tuner.backoff``): a study on the small space whose truth needs
more memory than the model says (every config predicted to leave under 6% of the card
free runs out of memory), measured in-process by the simulator. Before the back-off the
tuner launched 10 OOMs in 12 trials: each seed it liked sat closer to the edge."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.config.space import SEARCH_SPACES_DIR, load_space
from autotune.config.trial_config import TrialConfig
from autotune.study import StudySpec
from autotune.trial.prescreen import make_prescreen
from autotune.trial.record import TrialRecord
from autotune.trial.run import MemoryEstimate, TrialResult, derive_config
from autotune.tuner.backoff import BACKOFF, MemoryBackoff
from autotune.tuner.settings import TunerSettings
from autotune.vocabulary import Failure, FailureClass, Outcome
from tests.tuner.conftest import run_small_study

QWEN = SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml"
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


def _estimate(**params: object) -> MemoryEstimate:
    """The memory model's estimate of a config of the shipped Qwen space on the README's
    32 GB card with its sample workload's longest prompt."""
    space = load_space(QWEN)
    prescreen = make_prescreen(
        hardware="rtx4080s-32g", sim_model="qwen3.6-27b-awq", max_prompt_tokens=20_000
    )
    base = {"kv_cache_dtype": "auto", "lmcache": False, "mtp_k": 3}
    config = derive_config(
        space, base | params, model="qwen3.6-27b-awq", engine_version=None, prescreen=prescreen
    )
    estimate = prescreen(config)
    assert estimate is not None and estimate.fits
    return estimate


def test_a_launch_that_ran_keeps_configs_needing_less_memory_than_it_proposable() -> None:
    """README adverse: one OOM of a large prefill chunk (8 GiB, 5,142 tokens) set a floor
    that ruled out every config as tight as the leader (11 GiB of KV, 8 seats, 1,024
    tokens), which ran: its neighbour with 6 seats, truly 3% faster, was never launched.
    A config that needs more of one kind (a larger chunk's activations) stays ruled out."""
    ran = _estimate(kv_cache_memory_gib=11.0, max_num_seqs=8, max_num_batched_tokens=1024)
    oom = _estimate(kv_cache_memory_gib=8.0, max_num_seqs=4, max_num_batched_tokens=5142)
    fewer_seats = _estimate(kv_cache_memory_gib=11.0, max_num_seqs=6, max_num_batched_tokens=1024)
    larger_chunk = _estimate(kv_cache_memory_gib=10.75, max_num_seqs=8, max_num_batched_tokens=1300)
    backoff = MemoryBackoff()
    backoff.learn_ran(ran)
    assert backoff.learn(oom.margin)
    # All three are past the floor the OOM set: the margin alone rules them out.
    assert min(ran.margin, fewer_seats.margin, larger_chunk.margin) >= backoff.floor
    assert not backoff.presumes_oom(fewer_seats)  # needs less of every kind than what ran
    assert backoff.presumes_oom(larger_chunk)  # less KV but a larger chunk: not vouched for
    assert list(backoff.presumed([fewer_seats, larger_chunk, None])) == [False, True, False]
