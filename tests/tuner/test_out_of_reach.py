"""An SLO no config can meet: the warm start seeds the configs nearest to feasible (never
one predicted to OOM), the sampler goes on with the next nearest, and one line says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from autotune.config.space import load_space
from autotune.replay.load import LoadSpec
from autotune.trial.objective import Goal, ObjectiveName, parse_slos
from autotune.trial.prescreen import make_prescreen
from autotune.tuner.lattice import enumerate_effective
from autotune.tuner.predictor import SimOracle
from autotune.tuner.reach import out_of_reach
from autotune.tuner.session import Tuner
from autotune.tuner.settings import TunerSettings
from autotune.workload.expand import load_plan

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"
TWINS = REPO / "tests" / "e2e" / "data" / "fp8-twins.yaml"
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
HARDWARE, SIM_MODEL = "rtx4080s-32g", "qwen3.6-27b-awq"


def make_tuner(
    slo: str, warm_start: int = 3, space: Path = SMALL, settings: TunerSettings | None = None
) -> tuple[Tuner, SimOracle]:
    goal = Goal(objectives=[ObjectiveName.THROUGHPUT], slos=parse_slos([slo]))
    oracle = SimOracle(
        hardware=HARDWARE,
        sim_model=SIM_MODEL,
        plan=load_plan(WORKLOAD),
        load=LoadSpec(concurrency=4, max_requests=10),
        goal=goal,
    )
    tuner = Tuner(
        settings or TunerSettings(warm_start=warm_start),
        space=load_space(space),
        model=SIM_MODEL,
        engine_version=None,
        prescreen=make_prescreen(hardware=HARDWARE, sim_model=SIM_MODEL),
        oracle=oracle,
        maximize=True,
        guided=True,
        seed=1,
    )
    return tuner, oracle


@pytest.fixture(scope="module")
def unreachable() -> tuple[Tuner, SimOracle]:
    return make_tuner("ttft_p95<=10ms")  # a 14k-token prefix cannot prefill in 10 ms


def test_the_seeds_are_the_configs_nearest_to_the_slo_and_none_is_predicted_to_oom(
    unreachable: tuple[Tuner, SimOracle],
) -> None:
    tuner, oracle = unreachable
    guide = tuner.guide
    assert guide is not None and guide.predicted == 0  # nothing meets 10 ms
    # The simulator's own answer for every config of the space, pre-screen rejects too.
    prescreen = make_prescreen(hardware=HARDWARE, sim_model=SIM_MODEL)
    everything = enumerate_effective(
        load_space(SMALL), model=SIM_MODEL, engine_version=None, prescreen=prescreen
    )
    ttft = {}
    for candidate in everything:
        scored = oracle.score(candidate.config)
        if scored is not None and scored.values is not None:
            ttft[candidate.key] = scored.constraints["slo:ttft_p95"]
    seeds = tuner._seeds
    assert len(seeds) == 3
    assert all(seed.key in ttft for seed in seeds)  # each predicted to run: no OOM
    assert all(seed.memory is not None and seed.memory.fits for seed in seeds)
    margins = [ttft[seed.key] for seed in seeds]
    assert margins == sorted(margins)
    assert margins[0] == min(ttft.values())  # the least-violating config first
    ranked = sorted(ttft.values())
    assert max(margins) <= ranked[len(ranked) // 3]  # all among the nearest third


def test_after_the_seeds_the_sampler_proposes_the_next_nearest_not_a_random_draw(
    unreachable: tuple[Tuner, SimOracle],
) -> None:
    tuner, _ = unreachable
    guide, sampler = tuner.guide, tuner.sampler
    assert guide is not None and sampler is not None
    for seed in tuner._seeds:  # measured, and as slow as predicted
        tuner.index.add(
            seed.key, params=seed.params, trial=0, values=[1.0], constraints={}, measured=True
        )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    trial = study.ask(tuner.distributions)
    tried = guide.equivalent_to(set(tuner.index.by_key))
    expected = next(i for i in guide.nearest() if not tried[i])
    assert trial.params == guide.candidates[expected].params
    assert np.isfinite(guide.shortfall[expected])


def test_the_line_names_the_slo_the_best_predicted_value_and_its_config(
    unreachable: tuple[Tuner, SimOracle],
) -> None:
    tuner, oracle = unreachable
    assert tuner.guide is not None
    line = out_of_reach(tuner.guide, oracle.goal)
    assert line is not None
    best = tuner._seeds[0]
    predicted_s = (1 + tuner.guide.shortfall[tuner.guide.by_key[best.key]]) * 0.010
    assert line.startswith("No configuration is predicted to meet ttft_p95<=10ms: ")
    assert f"the best predicted p95 TTFT is {predicted_s:,.1f} s" in line
    assert f"max_num_seqs={best.params['max_num_seqs']}" in line
    assert "autotune workload slice --max-context" in line


def test_no_line_and_best_first_seeds_when_the_slo_is_in_reach() -> None:
    tuner, oracle = make_tuner("ttft_p95<=10m", warm_start=2)
    assert tuner.guide is not None and tuner.guide.predicted > 0
    assert out_of_reach(tuner.guide, oracle.goal) is None
    utility = tuner.guide.utility
    first = tuner.guide.by_key[tuner._seeds[0].key]
    assert utility[first] == np.nanmax(utility)


def test_what_the_screen_alone_scored_is_replayed_before_it_is_proposed() -> None:
    tuner, _ = make_tuner(  # the short list: one distinct prediction; the rest screened
        "ttft_p95<=10ms", settings=TunerSettings(warm_start=1, warm_start_configs=1)
    )
    guide, sampler = tuner.guide, tuner.sampler
    assert guide is not None and sampler is not None and guide.screened is not None
    assert guide.screened.sum() > len(guide.candidates) // 2
    for seed in tuner._seeds:
        tuner.index.add(
            seed.key, params=seed.params, trial=0, values=[1.0], constraints={}, measured=True
        )
    by_params = {str(c.params): c for c in guide.candidates}
    study = optuna.create_study(direction="maximize", sampler=sampler)
    proposed = []
    for number in range(1, 9):
        params = study.ask(tuner.distributions).params
        candidate = by_params[str(params)]  # a config of the lattice: it passed the pre-screen
        assert not guide.screened[guide.by_key[candidate.key]]  # replayed before proposed
        tuner.index.add(
            candidate.key, params=params, trial=number, values=[1.0], constraints={}, measured=True
        )
        proposed.append(candidate.key)
    assert len(set(proposed)) == 8


@pytest.mark.parametrize("slo", ["ttft_p95<=10m", "ttft_p95<=10ms"])
def test_seeds_are_not_twins_the_simulator_cannot_tell_apart(slo: str) -> None:
    """Before: fp8_e4m3 and fp8_e5m2 of one config (the same bytes and speed) were two
    seeds, one launch spent on a known answer (seen on real Claude Code traces)."""
    tuner, _ = make_tuner(slo, warm_start=2, space=TWINS)
    assert tuner.guide is not None
    seeds = tuner._seeds
    assert len(seeds) == 2
    assert seeds[0].params["max_num_seqs"] != seeds[1].params["max_num_seqs"], seeds


def test_a_measured_config_s_twin_counts_as_tried() -> None:
    """Before: once fp8_e4m3 of a config was measured, the sampler could still propose
    its fp8_e5m2 twin, and racing then re-measured both (3 runs each in one study)."""
    tuner, _ = make_tuner("ttft_p95<=10m", warm_start=2, space=TWINS)
    guide = tuner.guide
    assert guide is not None
    by_params = {tuple(sorted(c.params.items())): c.key for c in guide.candidates}
    e4m3 = by_params[(("kv_cache_dtype", "fp8_e4m3"), ("max_num_seqs", 2))]
    e5m2 = by_params[(("kv_cache_dtype", "fp8_e5m2"), ("max_num_seqs", 2))]
    other = by_params[(("kv_cache_dtype", "fp8_e4m3"), ("max_num_seqs", 4))]
    tried = guide.equivalent_to({e4m3})
    assert tried[guide.by_key[e5m2]]
    assert not tried[guide.by_key[other]]  # a different prediction stays untried
