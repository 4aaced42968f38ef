"""The two tiers: the screen scores every config, the replay judges the short list and
whatever is about to be launched or seeded."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autotune.config.space import load_space
from autotune.replay.load import LoadSpec
from autotune.trial.objective import Goal, ObjectiveName, Score, parse_slos
from autotune.trial.prescreen import make_prescreen
from autotune.tuner import two_tier
from autotune.tuner.guide import build_guide
from autotune.tuner.lattice import enumerate_effective
from autotune.tuner.predictor import SimOracle, predict_all
from autotune.tuner.two_tier import screen_rank, shortlist_size
from autotune.workload.expand import load_plan

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"  # 36 configs
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
HARDWARE, SIM_MODEL = "rtx4080s-32g", "qwen3.6-27b-awq"


def oracle() -> SimOracle:
    return SimOracle(
        hardware=HARDWARE,
        sim_model=SIM_MODEL,
        plan=load_plan(WORKLOAD),
        load=LoadSpec(),
        goal=Goal(objectives=[ObjectiveName.THROUGHPUT], slos=parse_slos(["ttft_p95<=20s"])),
    )


def lattice() -> list:
    prescreen = make_prescreen(hardware=HARDWARE, sim_model=SIM_MODEL)
    return [
        c
        for c in enumerate_effective(
            load_space(SMALL), model=SIM_MODEL, engine_version=None, prescreen=prescreen
        )
        if c.memory is None or c.memory.fits
    ]


def value(scored: Score | None) -> float:
    return scored.values[0] if scored is not None and scored.feasible and scored.values else 0.0


def test_the_screen_ranks_like_the_replay_and_keeps_its_best_in_the_short_list() -> None:
    found, sim = lattice(), oracle()
    configs = [c.config for c in found]
    screened, replayed = sim.screen(configs), predict_all(sim, configs)
    assert len(screened) == len(configs)
    screen_values = np.array([value(s) for s in screened])
    replay_values = np.array([value(s) for s in replayed])
    ranks = [np.argsort(np.argsort(v)) for v in (screen_values, replay_values)]
    assert np.corrcoef(*ranks)[0, 1] >= 0.7  # 0.77 here; the whole lattices: bench_screen.py
    best = int(np.argmax(replay_values))
    order = screen_rank(screened, maximize=True)
    assert best in order[:8].tolist()  # within the best 8 of 36 by the screen
    # A figure, not a copy: the screen's throughput is its own (within 25% where both run).
    both = (screen_values > 0) & (replay_values > 0)
    assert both.any()
    ratio = screen_values[both] / replay_values[both]
    assert not np.allclose(ratio, 1.0) and 0.75 <= np.median(ratio) <= 1.25


def test_the_guide_replays_only_the_short_list_then_what_it_seeds(monkeypatch) -> None:
    monkeypatch.setattr(two_tier, "SHORTLIST_MIN", 4)  # a short list shorter than the lattice
    monkeypatch.setattr(two_tier, "MAX_ERROR", 10.0)  # trusted: the list does not double
    sim, cache = oracle(), {}
    said: list[str] = []
    guide = build_guide(
        load_space(SMALL),
        model=SIM_MODEL,
        engine_version=None,
        prescreen=make_prescreen(hardware=HARDWARE, sim_model=SIM_MODEL),
        oracle=sim,
        maximize=True,
        cache=cache,
        say=said.append,
    )
    short = shortlist_size(len(guide.candidates))
    assert guide.replayed == short == len(cache) < len(guide.candidates)
    assert guide.screened is not None and guide.screened.sum() == len(guide.candidates) - short
    assert any("screened" in line and f"replayed {short}" in line for line in said)
    seeds = guide.diverse_top(short + 3)  # more seeds than the short list: some were screened
    indices = [guide.by_key[seed.key] for seed in seeds]
    assert not guide.screened[indices].any()  # every seed was replayed before it was handed out
    assert all(seed.key in cache for seed in seeds)
    assert guide.replayed_now > short
