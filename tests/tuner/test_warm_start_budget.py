"""The warm start's replays are counted, not timed: a slow machine replays the same
configs, the wall-clock limit is only a safety stop that says when it fired, and a resume
after it replays only what was never replayed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from autotune.config.space import load_space
from autotune.replay.load import LoadSpec
from autotune.trial.objective import Goal, ObjectiveName, Score, parse_slos
from autotune.trial.prescreen import make_prescreen
from autotune.tuner import two_tier
from autotune.tuner.guide import Guide, build_guide
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
        time.sleep(self.delay_s)  # the replay; the screen is not slowed
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
    shortlist: int | None,
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
        shortlist=shortlist,
        say=(said if said is not None else []).append,
    )


def replayed(found: Guide) -> set[str]:
    assert found.screened is not None
    return {
        c.key for c, screened in zip(found.candidates, found.screened, strict=True) if not screened
    }


def test_a_slower_machine_replays_the_same_configs() -> None:
    fast_cache: dict[str, Score | None] = {}
    slow_cache: dict[str, Score | None] = {}
    fast = guide(oracle(), fast_cache, shortlist=3, stop_s=60)
    slow = guide(oracle(delay_s=0.05), slow_cache, shortlist=3, stop_s=60)
    assert replayed(fast) == replayed(slow) == set(fast_cache) == set(slow_cache)
    assert 3 <= len(replayed(slow)) < len(slow.candidates)
    assert fast.stopped == slow.stopped == 0


def test_the_tuner_counts_the_short_list_in_distinct_predictions(monkeypatch) -> None:
    monkeypatch.setattr(two_tier, "SHORTLIST_MIN", 6)

    def tuner(settings: TunerSettings) -> Tuner:
        return Tuner(
            settings,
            space=load_space(SMALL),
            model=SIM_MODEL,
            engine_version=None,
            prescreen=make_prescreen(hardware=HARDWARE, sim_model=SIM_MODEL),
            oracle=oracle(),
            maximize=True,
            guided=True,
            n_trials=20,
            seed=1,
            say=heard.append,
        )

    heard: list[str] = []
    every = tuner(TunerSettings())
    assert "the best 6 distinct predictions" in heard[0], heard
    some = tuner(TunerSettings(warm_start_configs=2))
    assert "the best 2 distinct predictions" in heard[-2], heard
    assert every.guide is not None and some.guide is not None
    assert len(replayed(some.guide)) < len(replayed(every.guide)) < len(every.guide.candidates)
    assert f"{len(replayed(some.guide))} replayed" in (some.describe() or "")


def test_the_safety_stop_stops_promptly_says_so_and_a_resume_replays_only_the_rest() -> None:
    slow = oracle(delay_s=0.25)
    warm = guide(oracle(), {}, shortlist=1)  # the lattice is enumerated once a process: not timed
    started = time.monotonic()
    slow.score(warm.candidates[0].config)
    one_s = time.monotonic() - started  # one replay on this machine, as loaded as it is
    cache: dict[str, Score | None] = {}
    said: list[str] = []
    started = time.monotonic()
    cut = guide(slow, cache, shortlist=12, stop_s=1.0, said=said)
    took = time.monotonic() - started
    assert took < 1.0 + 2 * one_s + 2.0  # the screen, then one replay late at most
    assert cut.stopped > 0 and len(cache) < len(replayed(guide(oracle(), {}, shortlist=12)))
    assert "stopped by the 1-s safety stop" in said[-1], said
    first = set(cache)
    # The resume: the study hands back what was replayed; only the rest is replayed.
    seen: list[str] = []
    resumed = guide(oracle(), cache, shortlist=12, said=seen)
    assert f"({len(first)} replays from the prediction cache)" in seen[0], seen
    assert resumed.stopped == 0 and first < set(cache)
    # ... and ends with the very configs a run never stopped replays.
    assert replayed(resumed) == replayed(guide(oracle(), {}, shortlist=12))


def test_a_study_stored_with_another_safety_stop_resumes() -> None:
    """Before: a study created when the stop was the 300-s budget was refused on resume
    ("warm_start_budget_s 300.0, now 1800.0"); the count is still checked."""
    from autotune.errors import StudyMismatchError
    from autotune.study.create import _check_same_tuner

    now = TunerSettings().model_dump(mode="json")
    _check_same_tuner("t", {"tuner": now | {"warm_start_budget_s": 300.0}}, now)
    with pytest.raises(StudyMismatchError, match="warm_start_configs 50, now null"):
        _check_same_tuner("t", {"tuner": now | {"warm_start_configs": 50}}, now)
