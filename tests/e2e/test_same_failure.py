"""A run whose first launches all fail the same way stops with the engine's own line
(`autotune run` on the simulator), and the watch behind it (real Optuna studies)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest

from autotune.replay.records import ReplayStats
from autotune.study.verdict import SAME_FAILURE_TRIALS, SameFailureWatch, stored_verdict
from autotune.trial.record import TrialRecord
from autotune.vocabulary import Failure, FailureClass, Outcome
from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD, autotune_argv, processes_in, tuner_args

FITS_SPACE = REPO / "tests" / "e2e" / "data" / "fits.yaml"
REJECTED = "argument --kv-cache-dtype: invalid choice: 'fp9'"


@pytest.mark.timeout(240)
def test_a_value_the_engine_rejects_stops_the_run_after_three_launches(tmp_path: Path) -> None:
    """Before: all 20 trials invalid-args, exit 0, the reason only in the server logs."""
    space = tmp_path / "space.yaml"  # vLLM 0.33 rejects it too (Invalid kv_cache_dtype)
    space.write_text(FITS_SPACE.read_text().replace("fixed:\n", "fixed:\n  kv-cache-dtype: fp9\n"))
    db = tmp_path / "autotune.db"
    args = [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(space),
        "--storage", f"sqlite:///{db}", "--study", "bad", "--sampler", "random", "--trials", "20",
        *tuner_args(tmp_path, {"seed": 3, "warm_start": 0, "confirm": 0, "dedup": False,
                               "load": {"max_requests": 4}, "simulator": {"time_scale": 200}}),
    ]  # fmt: skip
    run = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=200
    )
    assert run.returncode == 1, run.stdout + run.stderr
    study = optuna.load_study(study_name="bad", storage=f"sqlite:///{db}")
    outcomes = [TrialRecord.read(t.user_attrs).outcome for t in study.trials]
    assert outcomes == [FailureClass.INVALID_ARGS] * SAME_FAILURE_TRIALS
    verdict_line = next(line for line in run.stdout.splitlines() if line.startswith("stopped:"))
    assert "the first 3 launches (trials 0, 1, 2)" in verdict_line
    assert f"The engine said: vllm serve: error: {REJECTED}" in verdict_line
    assert run.stdout.count(REJECTED) == 4  # each trial's line, then the verdict
    run_log = next(tmp_path.glob("runs/*/run.log")).read_text()
    assert verdict_line in run_log
    verdict = stored_verdict(study)
    assert verdict is not None and verdict.trials == (0, 1, 2)
    assert processes_in(tmp_path) == []


def _study() -> optuna.Study:
    return optuna.create_study(storage="sqlite:///:memory:", direction="maximize")


def _run(study: optuna.Study, watch: SameFailureWatch, records: list[TrialRecord]) -> None:
    """Trials ending with ``records`` stored, in a real optimize loop with the watch."""
    pending = list(records)

    def objective(trial: optuna.Trial) -> float:
        pending.pop(0).write(trial)
        return 0.0

    study.optimize(objective, n_trials=len(records), callbacks=[watch])


def _failed(failure_class: FailureClass = FailureClass.UNSUPPORTED_CONFIG, message: str = "x"):
    failure = Failure(failure_class=failure_class, message=message)
    return TrialRecord(outcome=failure_class, failure=failure)


def test_three_identical_failures_stop_the_study_and_store_the_verdict() -> None:
    study = _study()
    watch = SameFailureWatch(study)
    not_launched = TrialRecord(outcome=Outcome.PREDICTED_OOM)  # not counted either way
    _run(study, watch, [_failed(), _failed(), not_launched, *[_failed()] * 5])
    assert len(study.trials) == 4  # stopped after the third identical launch
    assert watch.verdict is not None and watch.verdict.trials == (0, 1, 3)
    assert stored_verdict(study) == watch.verdict


@pytest.mark.parametrize(
    "interloper",
    [
        _failed(message="another line"),
        _failed(FailureClass.ENGINE_DEAD),
        _failed(FailureClass.KV_DOES_NOT_FIT),  # OOMs map the space; they never count
    ],
    ids=["another-message", "another-class", "an-oom"],
)
def test_a_different_launch_among_the_first_ones_stands_the_watch_down(
    interloper: TrialRecord,
) -> None:
    study = _study()
    watch = SameFailureWatch(study)
    _run(study, watch, [_failed(), interloper, _failed(), _failed(), _failed()])
    assert len(study.trials) == 5
    assert watch.verdict is None and stored_verdict(study) is None


def test_a_study_that_measured_a_config_is_never_stopped() -> None:
    study = _study()
    trial = study.ask()
    replay = ReplayStats(
        duration_s=1.0, completed=1, failed=0, total_input_tokens=1, total_output_tokens=1,
        request_throughput_rps=1.0, output_throughput_tok_s=1.0, total_token_throughput_tok_s=2.0,
    )  # fmt: skip
    TrialRecord(outcome=Outcome.OK, replay=replay).write(trial)
    study.tell(trial, 1.0)
    resumed = SameFailureWatch(study)  # a later run of the same study
    _run(study, resumed, [_failed()] * 4)
    assert len(study.trials) == 5 and resumed.verdict is None
