"""The tuner's settings: how the simulator-steered search spends the trial budget.

Each key is documented once, with its default and why, in docs/tuner.md. They are
read from a space file's ``tuner:`` section or a ``--tuner FILE``
(``autotune.tuner.settings_file``), stored with the study (a resume and ``autotune worker``
use the same), and handed to ``Tuner`` whole. Like an Optuna sampler's constructor
arguments, they are the search's own knobs, not the user's decisions about the run.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.defaults import DEFAULT_PRUNE


class TunerSettings(BaseModel):
    """The search's switches; the defaults are the measured ones (docs/tuner.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    warm_start: int = Field(default=4, ge=0)  # predicted-best configs after the baseline (0: off)
    # Distinct screen predictions the replay's short list takes (None: 2% of the lattice,
    # at least 16; tuner/two_tier.py). Every config is screened whatever it is.
    warm_start_configs: int | None = Field(default=None, ge=1)
    # A safety stop for the replays in wall seconds (None: none); the budget is a count.
    warm_start_budget_s: float | None = Field(default=1800.0, gt=0)
    learn: bool = True  # learn the simulator's residual from measurements
    confirm: int = Field(default=24, ge=0)  # trials at the end spent re-measuring (0: off)
    race: bool = True  # re-measure where it most raises the crown's expected value (off: duel)
    race_early: bool = True  # re-measure before the tail when worth more than exploring
    crown_prior: bool = False  # the crown weighs the simulator's corrected prediction too
    explore_tail: bool = True  # the tail explores while a config is predicted to beat the leader
    refine: bool = True  # after each new measurement, add off-lattice configs near the best
    overtake: bool = True  # once a seed is measured, the best estimate launches next
    recalibrate: bool = True  # re-predict MTP configs with the acceptance trials measured
    # ... and every config with the card's speed fitted to the trials (needs recalibrate)
    recalibrate_speed: bool = True
    reseed: bool = False  # after a recalibration, seeds not launched yet follow the new ranking
    local_search: int = Field(default=4, ge=0)  # tail launches of the leaders' neighbours
    dedup: bool = True  # never launch a measured effective config again
    recheck: bool = False  # re-measure a new leader measured once, at once (bench: off wins)
    prune: bool = DEFAULT_PRUNE  # stop a trial whose throughput so far is far below the best's
    prescreen: bool = True  # score what the memory model rejects as predicted-oom, unlaunched
    backoff: bool = True  # after an OOM launch, configs predicted tighter are not proposed
    edge_search: bool = True  # ... and the best memory edges it rules out retreat to what fits
    seed: int | None = None  # the sampler's and the simulator's seed (None: a fresh draw)

    def replaced(self, **changes: Any) -> TunerSettings:
        """A copy with ``changes``, validated like the file's keys."""
        return TunerSettings.model_validate(self.model_dump() | changes)

    def changed(self) -> dict[str, Any]:
        """The keys that differ from their defaults, with their values."""
        default = TunerSettings()
        return {
            name: value
            for name, value in self.model_dump().items()
            if value != getattr(default, name)
        }
