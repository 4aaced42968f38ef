"""How many runs the crown needs to tell two configs apart under the harsh bench's noise.

Two configs a small gap apart, each measured ``n`` times on alternating launches under
``scripts/bench_tuner.py``'s harsh noise (Student-t, 3 degrees of freedom, 3% spread, an
outlier now and then) and its drift (0.2% a launch). The crown
(``autotune.tuner.confirm.crown``: levels through drift and odd runs, ties within half a
standard error to the config that needs least) hands one over; which of the two needs
less is a coin toss per duel. The table: how often the crown hands over the better one,
how often the best level (the crown before ties) is the better one, and the plain mean
of the runs (the baseline; the ratio is the crown's against it). It bounds what any
allocation of a study's re-measurements can reach where its top configs lie this close.

A second table: one lucky run. The better config measured ``n`` times, then a config a
gap below it launched once (the night's last launch, say); how often the crown still
hands over the better one, and the plain means (the worse one's single run against the
better one's mean).

    python scripts/bench_crown_noise.py [--duels 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tuner import DRIFT_PER_LAUNCH, noise_factor

from autotune.tuner.confirm import crown, ranked
from autotune.tuner.measured import MeasuredIndex

GAPS = (0.010, 0.012, 0.016)  # L40S adverse: its misses crowned configs 1.2-1.6% below
RUNS = (3, 5, 10, 15, 20)


def duel(gap: float, runs: int, seed: int) -> tuple[bool, bool, bool]:
    """One duel: whether the crown picked the better config, the best level (the crown
    before ties) did, the plain mean did."""
    names = ["better", "worse"]
    random.Random(seed).shuffle(names)  # which one sorts first when they tie
    better, worse = names
    index = MeasuredIndex()
    values: dict[str, list[float]] = {better: [], worse: []}
    for trial in range(2 * runs):
        first = (trial // 2) % 2 == 0  # the pair's order alternates: drift favours neither
        key = better if (trial % 2 == 0) == first else worse
        share = 1.0 if key == better else 1.0 - gap
        noise = noise_factor("duel", seed, key, trial // 2, figure="throughput", harsh=True)
        value = 100.0 * share * noise * (1.0 - DRIFT_PER_LAUNCH * trial)
        values[key].append(value)
        index.add(key, params={}, trial=trial, values=[value], constraints={}, measured=True)
    crowned = crown(index, maximize=True)
    assert crowned is not None
    by_level = ranked(index, maximize=True)[0].key == better
    by_mean = statistics.fmean(values[better]) > statistics.fmean(values[worse])
    return crowned.key == better, by_level, by_mean


def lucky(gap: float, runs: int, seed: int) -> tuple[bool, bool]:
    """One night: the better config measured ``runs`` times, then one ``gap`` below it
    measured once; whether the crown and the plain means pick the better one."""
    names = ["better", "worse"]
    random.Random(seed).shuffle(names)  # which one needs less: a coin toss
    better, worse = names
    index = MeasuredIndex()
    values: dict[str, list[float]] = {better: [], worse: []}
    for trial in range(runs + 1):
        key = better if trial < runs else worse
        share = 1.0 if key == better else 1.0 - gap
        noise = noise_factor("lucky", seed, key, trial, figure="throughput", harsh=True)
        value = 100.0 * share * noise * (1.0 - DRIFT_PER_LAUNCH * trial)
        values[key].append(value)
        index.add(key, params={}, trial=trial, values=[value], constraints={}, measured=True)
    crowned = crown(index, maximize=True)
    assert crowned is not None
    return crowned.key == better, statistics.fmean(values[better]) > values[worse][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duels", type=int, default=2000, help="duels per row")
    args = parser.parse_args()
    print("| gap | runs of each | crown picks the better | best level | plain mean | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for gap in GAPS:
        for runs in RUNS:
            results = [duel(gap, runs, seed) for seed in range(args.duels)]
            shares = (sum(column) / len(results) for column in zip(*results, strict=True))
            ours, level, plain = shares
            print(
                f"| {gap:.1%} | {runs} | {ours:.0%} | {level:.0%} | {plain:.0%} "
                f"| {ours / plain:.2f} |"
            )
    print("\n| gap | runs of the better | crown picks the better | plain means | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for gap in GAPS:
        for runs in RUNS:
            results = [lucky(gap, runs, seed) for seed in range(args.duels)]
            ours, plain = (sum(column) / len(results) for column in zip(*results, strict=True))
            print(f"| {gap:.1%} | {runs} | {ours:.0%} | {plain:.0%} | {ours / plain:.2f} |")


if __name__ == "__main__":
    main()
