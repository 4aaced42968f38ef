"""The tuner benchmark's pure helpers: paired noise, sampler seeds, the merged table."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_tuner.py"
_spec = importlib.util.spec_from_file_location("bench_tuner", SCRIPT)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_tuner"] = bench  # its dataclasses resolve their annotations there
_spec.loader.exec_module(bench)


def test_noise_is_keyed_by_truth_seed_config_and_measurement_not_by_strategy():
    first = bench.noise_factor("readme", 3, "config-a", 0)
    assert bench.noise_factor("readme", 3, "config-a", 0) == first  # any strategy, same draw
    others = {
        bench.noise_factor("readme", 3, "config-a", 1),  # its second measurement
        bench.noise_factor("readme", 3, "config-b", 0),
        bench.noise_factor("readme", 4, "config-a", 0),
        bench.noise_factor("readme (adverse)", 3, "config-a", 0),
    }
    assert first not in others and len(others) == 4


def test_noise_spread_is_the_stated_three_percent():
    draws = [bench.noise_factor("t", 0, f"c{i}", 0) for i in range(4000)]
    assert abs(statistics.fmean(draws) - 1.0) < 0.003
    assert abs(statistics.stdev(draws) - bench.NOISE) < 0.003


def test_sampler_seeds_differ_between_samplers_and_repeat_within_one():
    seeds = {bench.sampler_seed(name, 0) for name in ("random", "tpe", "gp", "guided")}
    assert len(seeds) == 4
    assert bench.sampler_seed("guided", 0) == bench.sampler_seed("guided", 0)
    assert bench.sampler_seed("guided", 0) != bench.sampler_seed("guided", 1)


def _record(strategy: str, seed: int, curve: list[float], launched_best: float) -> dict:
    log = bench.StudyLog(launches=len(curve), handed_over=curve, launched_best=launched_best)
    return bench.study_record("readme", strategy, seed, 100.0, log)


def test_table_reads_against_the_best_launched_config_when_it_beats_the_lattice(tmp_path):
    raw = tmp_path / "raw.jsonl"
    records = [
        _record("random", 0, [90.0, 100.0, 100.0], 100.0),
        _record("guided", 0, [102.0, 102.0, 102.0], 102.0),  # off the lattice, truly better
    ]
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = {row["strategy"]: row for row in bench.table([raw], budget=3)}
    assert rows["random"]["optimum_tok_s"] == 102.0
    assert rows["random"]["median_launches_to_99"] is None  # 100/102 < 0.99
    assert rows["random"]["median_launches_to_95"] == 2
    assert rows["guided"]["median_launches_to_99"] == 1
    assert rows["guided"]["winner_within_1pct_rate"] == 1.0
