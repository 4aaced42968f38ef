"""The tuner's hooks into a study: guide, seeds, no repeated launches, confirmation, crown.

``autotune.study`` creates one ``Tuner`` per run and calls it at four points:
the sampler (``sampler``), after the baseline is enqueued (``seed``), around
each trial (``twin`` before launching, ``record`` after) and after the search
(``confirm``). Each technique has its switch in ``TunerSettings``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.defaults import DEFAULT_PRUNE
from autotune.space import SearchSpace
from autotune.trial import Prescreen
from autotune.tuner.confirm import confirmation_targets, crown
from autotune.tuner.guide import Guide, PredictionCache, build_guide
from autotune.tuner.measured import Measured, MeasuredIndex
from autotune.tuner.predictor import SimOracle
from autotune.tuner.sampler import GuidedSampler

WINNER_ATTR = "winner"  # study attr: the crowned config after confirmation
WARM_START_ATTR = "warm_start"  # study attr: what the warm start predicted


@dataclass(frozen=True)
class TunerSettings:
    """Switches of the simulator-steered search (``autotune run`` options)."""

    warm_start: int = 4  # predicted-best configs launched after the baseline (0: off)
    learn: bool = True  # learn the simulator's residual from measurements
    confirm: int = 3  # top configs re-measured before crowning (0: off)
    dedup: bool = True  # never launch a measured effective config again
    prune: bool = DEFAULT_PRUNE  # stop a trial whose throughput so far is far below the best's


class Tuner:
    """See the module docstring."""

    def __init__(
        self,
        settings: TunerSettings,
        *,
        space: SearchSpace,
        model: str,
        engine_version: str | None,
        prescreen: Prescreen | None,
        oracle: SimOracle | None,
        maximize: bool,
        guided: bool,
        seed: int | None = None,
        cache: PredictionCache | None = None,
    ) -> None:
        self.settings = settings
        self.maximize = maximize
        self.index = MeasuredIndex()
        self.guide: Guide | None = None
        self.sampler: GuidedSampler | None = None
        if guided and oracle is not None:
            self.guide = build_guide(
                space,
                model=model,
                engine_version=engine_version,
                prescreen=prescreen,
                oracle=oracle,
                maximize=maximize,
                cache=cache,
            )
            self.sampler = GuidedSampler(
                self.guide,
                self.index,
                space.distributions(engine_version),
                maximize=maximize,
                learn=settings.learn,
                seed=seed,
            )

    def seed(self, study: optuna.Study) -> list[dict[str, Any]]:
        """Enqueue the warm-start configs (diverse, best predicted first); returns their params."""
        if self.guide is None or self.settings.warm_start <= 0:
            return []
        seeds = [c.params for c in self.guide.diverse_top(self.settings.warm_start)]
        study.set_user_attr(
            WARM_START_ATTR,
            {
                "effective_configs": len(self.guide.candidates),
                "predicted_feasible": self.guide.predicted,
                "seconds": round(self.guide.seconds, 1),
                "seeds": len(seeds),
            },
        )
        for rank, params in enumerate(seeds, start=1):
            study.enqueue_trial(params, user_attrs={"warm_start": rank}, skip_if_exists=True)
        return seeds

    def rebuild(self, study: optuna.Study, key_of: Callable[[dict[str, Any]], str]) -> None:
        """Fill the index from a resumed study's COMPLETE trials."""
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if trial.user_attrs.get("duplicate_of") is not None:
                continue
            self.record(trial, key_of(trial.params), trial.values, trial.constraints)

    def twin(self, key: str, trial: optuna.Trial) -> Measured | None:
        """The earlier measurement of this launch, unless dedup is off or this re-measures."""
        if not self.settings.dedup or trial.user_attrs.get("confirms") is not None:
            return None
        return self.index.get(key)

    def record(
        self,
        trial: FrozenTrial | optuna.Trial,
        key: str,
        values: list[float] | None,
        constraints: dict[str, float],
    ) -> None:
        measured = bool(trial.user_attrs.get("measured")) and values is not None
        self.index.add(
            key,
            params=dict(trial.params),
            trial=trial.number,
            values=values,
            constraints=constraints,
            measured=measured,
        )

    def crowned(self) -> Measured | None:
        return crown(self.index, maximize=self.maximize, sampler=self.sampler)

    def confirm(self, study: optuna.Study, run: Callable[[int], None]) -> Measured | None:
        """Re-measure the top ``confirm`` configs (``run(n)`` runs n enqueued trials), crown."""
        count = self.settings.confirm
        if count > 0:
            targets = confirmation_targets(
                self.index, count, maximize=self.maximize, sampler=self.sampler
            )
            for entry in targets:
                study.enqueue_trial(entry.params, user_attrs={"confirms": entry.first_trial})
            if targets:
                run(len(targets))
        winner = self.crowned()
        if winner is not None:
            study.set_user_attr(
                WINNER_ATTR,
                {
                    "trial": winner.first_trial,
                    "trials": winner.trials,
                    "mean": winner.mean,
                    "spread": winner.spread,
                    "measurements": len(winner.samples),
                },
            )
        return winner

    def describe(self) -> str | None:
        """One line on the warm start, or None without a guide."""
        if self.guide is None:
            return None
        return (
            f"warm start: {len(self.guide.candidates)} effective configs that fit, "
            f"{self.guide.predicted} predicted feasible, in {self.guide.seconds:.0f} s"
        )
