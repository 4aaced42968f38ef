"""Measured effective configs of a study: no launch for a known answer.

Keys are the launched flags (lattice.config_key), so two parameter sets that
derived rules map to the same launch share one measurement. Confirmation
re-measurements are added to the same key; ``Measured`` keeps them all.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

MEASUREMENT_SD = 0.03  # run-to-run spread of one measurement (log scale)


@dataclass
class Measured:
    """Everything measured for one effective config."""

    key: str
    params: dict
    first_trial: int
    values: list[float] | None  # the first measurement's objective values (None: unmeasured)
    constraints: dict[str, float]
    feasible: bool
    samples: list[float] = field(default_factory=list)  # first objective, every measurement
    sample_trials: list[int] = field(default_factory=list)  # the trial of each sample
    trials: list[int] = field(default_factory=list)
    centre: int | None = None  # launched by the local search: its centre's first trial

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def spread(self) -> float:
        """Sample standard deviation of the measurements (0 with one)."""
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0


class MeasuredIndex:
    """Effective config key -> what was measured for it."""

    def __init__(self) -> None:
        self.by_key: dict[str, Measured] = {}
        self.seen: set[int] = set()  # trial numbers already added
        self.pending: set[str] = set()  # keys other workers are measuring now
        self.confirming: Counter[int] = Counter()  # first trial -> re-measurements running
        self.by_trial: dict[int, Measured] = {}  # every trial added -> its config's entry

    def get(self, key: str) -> Measured | None:
        return self.by_key.get(key)

    def add(
        self,
        key: str,
        *,
        params: dict,
        trial: int,
        values: list[float] | None,
        constraints: dict[str, float],
        measured: bool,
        centre: int | None = None,
    ) -> Measured:
        """Record one trial; a later trial of a known key adds a sample to it."""
        feasible = measured and all(v <= 0 for v in constraints.values())
        entry = self.by_key.get(key)
        if entry is None:
            entry = Measured(key, params, trial, values, constraints, feasible, centre=centre)
            self.by_key[key] = entry
        elif not feasible:
            entry.feasible = False  # a config that failed once is not crowned
        if measured and values:
            entry.samples.append(values[0])
            entry.sample_trials.append(trial)
        entry.trials.append(trial)
        self.seen.add(trial)
        self.by_trial[trial] = entry
        return entry
