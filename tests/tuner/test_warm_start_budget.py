"""The warm start's budget is counted in configs: a slow machine predicts the same ones,
the wall-clock limit is only a safety stop that says when it fired, and a resume after
it predicts only what was never predicted."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.config.space import load_space
from autotune.replay.load import LoadSpec
from autotune.trial.objective import Goal, ObjectiveName, Score, parse_slos
from autotune.trial.prescreen import make_prescreen
from autotune.tuner.guide import Guide, build_guide, warm_start_queue
from autotune.tuner.predictor import SimOracle
from autotune.tuner.session import Tuner
from autotune.tuner.settings import TunerSettings
from autotune.workload.expand import load_plan

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"  # 36 configs, predicted in process
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
HARDWARE, SIM_MODEL = "rtx4080s-32g", "qwen3.6-27b-awq"


@dataclass(frozen=True)
class SlowOracle(SimOracle):
    """The simulator on a slower machine: each prediction waits ``delay_s`` first."""

    delay_s: float = 0.0

    def score(self, config):  # type: ignore[no-untyped-def]  # SimOracle.score's signature
        time.sleep(self.delay_s)
        return super().score(config)


def oracle(delay_s: float = 0.0) -> SlowOracle:
    return SlowOracle(
        hardware=HARDWARE,
        sim_model=SIM_MODEL,
        plan=load_plan(WORKLOAD),
        load=LoadSpec(concurrency=4, max_requests=10),
        goal=Goal(objectives=[ObjectiveName.THROUGHPUT], slos=parse_slos(["ttft_p95<=20s"])),
        delay_s=delay_s,
    )


def guide(
    slow: SlowOracle,
    cache: dict[str, Score | None],
    *,
    configs: int | None,
    stop_s: float | None = None,
    said: list[str] | None = None,
) -> Guide:
    return build_guide(
        load_space(SMALL),
        model=SIM_MODEL,
        engine_version=None,
        prescreen=make_prescreen(hardware=HARDWARE, sim_model=SIM_MODEL),
        oracle=slow,
        maximize=True,
        cache=cache,
        budget_s=stop_s,
        max_predictions=configs,
        say=(said if said is not None else []).append,
    )


def predicted(found: Guide) -> set[str]:
    return {
        c.key for c, unknown in zip(found.candidates, found.unpredicted, strict=True) if not unknown
    }


def test_a_slower_machine_predicts_the_same_configs() -> None:
    fast_cache: dict[str, Score | None] = {}
    slow_cache: dict[str, Score | None] = {}
    fast = guide(oracle(), fast_cache, configs=12, stop_s=60)
    slow = guide(oracle(delay_s=0.05), slow_cache, configs=12, stop_s=60)
    assert predicted(fast) == predicted(slow) == set(fast_cache) == set(slow_cache)
    assert len(predicted(slow)) == 12 < len(slow.candidates)
    assert predicted(slow) == {c.key for c in warm_start_queue(slow.candidates, 12)}
    assert fast.stopped == slow.stopped == 0


def test_the_tuner_counts_the_budget_in_configs_per_trial_or_as_set() -> None:
    def tuner(settings: TunerSettings, n_trials: int) -> Tuner:
        return Tuner(
            settings,
            space=load_space(SMALL),
            model=SIM_MODEL,
            engine_version=None,
            prescreen=make_prescreen(hardware=HARDWARE, sim_model=SIM_MODEL),
            oracle=oracle(),
            maximize=True,
            guided=True,
            n_trials=n_trials,
            seed=1,
        )

    every = tuner(TunerSettings(), n_trials=1)  # 100 a trial: all of it
    assert every.guide is not None and every.guide.known == len(every.guide.candidates)
    some = tuner(TunerSettings(warm_start_configs=7), n_trials=20)
    assert some.guide is not None and some.guide.known == 7
    assert "predicted 7 of them (a budget of 7 configs" in (some.describe() or "")


def test_the_safety_stop_stops_promptly_says_so_and_a_resume_predicts_only_the_rest() -> None:
    slow = oracle(delay_s=0.25)
    warm = guide(oracle(), {}, configs=1)  # the lattice is enumerated once a process: not timed
    started = time.monotonic()
    slow.score(warm.candidates[0].config)
    one_s = time.monotonic() - started  # one prediction on this machine, as loaded as it is
    cache: dict[str, Score | None] = {}
    said: list[str] = []
    started = time.monotonic()
    cut = guide(slow, cache, configs=20, stop_s=1.0, said=said)
    assert time.monotonic() - started < 1.0 + 2 * one_s + 0.5  # one prediction late at most
    assert 0 < cut.known <= 4 and cut.stopped == 20 - cut.known  # 0.25 s each
    assert "stopped by the 1-s safety stop" in said[-1], said
    first = set(cache)
    # The resume: the study hands back what was predicted; only the rest is predicted.
    seen: list[str] = []
    resumed = guide(oracle(), cache, configs=20, said=seen)
    assert f"Warm start: predicting {20 - cut.known} configs" in seen[0], seen
    assert f"({cut.known} more from the prediction cache)" in seen[0]
    assert resumed.known == 20 and resumed.stopped == 0 and first < set(cache)
    # ... and ends with the very configs a run never stopped predicts.
    assert predicted(resumed) == predicted(guide(oracle(), {}, configs=20))


def test_a_study_stored_with_another_safety_stop_resumes() -> None:
    """Before: a study created when the stop was the 300-s budget was refused on resume
    ("warm_start_budget_s 300.0, now 1800.0"); the budget in configs is still checked."""
    from autotune.errors import StudyMismatchError
    from autotune.study.create import _check_same_tuner

    now = TunerSettings().model_dump(mode="json")
    _check_same_tuner("t", {"tuner": now | {"warm_start_budget_s": 300.0}}, now)
    with pytest.raises(StudyMismatchError, match="warm_start_configs 50, now null"):
        _check_same_tuner("t", {"tuner": now | {"warm_start_configs": 50}}, now)
