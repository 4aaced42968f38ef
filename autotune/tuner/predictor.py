"""The simulator as an in-process oracle: a TrialConfig -> what a trial would measure.

``predict_config`` maps a launch config onto the simulator (the catalog model
and GPU stand in for the user's), predicts a whole replay in virtual time and
returns the Prediction; ``predict_all`` does that for many configs, on worker
processes when there are many.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.config import SimConfig
from autotune.sim.server.flags import parse_serve_args
from autotune.sim.virtual.predict import Prediction, catalog_acceptance, plan_renderer, predict
from autotune.sim.virtual.screen import Screened, screen
from autotune.trial.objective import Goal, Score, request_slo, score
from autotune.trial.prescreen import memory_margin
from autotune.tuner.forked import default_workers, forked_map, worker_state
from autotune.vocabulary import Failure
from autotune.workload.plan import WorkloadPlan

PARALLEL_ABOVE = 64  # fewer configs than this are predicted in this process
_STOPPED = object()  # the results ended at the deadline


@dataclass(frozen=True)
class SimOracle:
    """Everything a prediction needs besides the config."""

    hardware: str  # GPU catalog name
    sim_model: str  # model catalog name
    plan: WorkloadPlan
    load: LoadSpec
    goal: Goal
    calibration: CalibrationProfile | None = None  # speed constants; None: the defaults
    seed: int = 0  # the simulator's random draws (MTP acceptance)

    def sim_config(self, config: TrialConfig) -> SimConfig | None:
        """The simulator's view of ``config``; None when the simulator rejects its flags."""
        argv = [self.sim_model, *config.vllm_args()[1:], "--hardware", self.hardware]
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                sim = parse_serve_args(argv).sim
        except SystemExit:
            return None
        return sim

    def predict(self, config: TrialConfig) -> Prediction | None:
        """The predicted replay of ``config``; None when the simulator cannot model it."""
        sim = self.sim_config(config)
        if sim is None:
            return None
        try:
            return predict(
                sim,
                self.plan,
                self.load,
                slo=request_slo(self.goal.slos),
                seed=self.seed,
                calibration=self.calibration,
            )
        except InputError:
            return None

    def score(self, config: TrialConfig) -> Score | None:
        """The predicted objective values and constraints of ``config``."""
        prediction = self.predict(config)
        return None if prediction is None else score_prediction(self.goal, prediction)

    def screen(self, configs: Sequence[TrialConfig]) -> list[Score | None]:
        """The screen's scores of ``configs`` (``sim/virtual/screen/``: well under a
        millisecond a config, a ranking to pick what the replay judges); None where the
        simulator cannot model a config."""
        sims = [self.sim_config(config) for config in configs]
        modelled = [sim for sim in sims if sim is not None]
        screened = iter(
            screen(
                modelled,
                self.plan,
                self.load,
                slo=request_slo(self.goal.slos),
                calibration=self.calibration,
                acceptance=catalog_acceptance(self.sim_model, self.plan),
                renderer=plan_renderer(self.plan),
            )
        )
        return [None if sim is None else score_screened(self.goal, next(screened)) for sim in sims]


def score_prediction(goal: Goal, prediction: Prediction) -> Score:
    """Score a prediction exactly as a measured trial is scored."""
    memory = prediction.memory
    margin = memory_margin(memory.headroom_bytes, memory.visible_bytes, fits=memory.fits)
    return score(
        goal,
        stats=prediction.stats if prediction.records else None,
        failure=prediction.failure,
        memory_margin=margin,
    )


def score_screened(goal: Goal, screened: Screened) -> Score:
    """Score the screen's figures as a prediction is scored."""
    memory = screened.memory
    margin = memory_margin(memory.headroom_bytes, memory.visible_bytes, fits=memory.fits)
    failure = None
    if screened.failure is not None:
        text = f"screened: {screened.failure.value}"
        failure = Failure(failure_class=screened.failure, message=text, log_excerpt=text)
    return score(goal, stats=screened.stats, failure=failure, memory_margin=margin)


def _score_in_worker(config: TrialConfig) -> Score | None:
    oracle: SimOracle = worker_state()
    return oracle.score(config)


def predict_all(
    oracle: SimOracle, configs: Sequence[TrialConfig], *, workers: int | None = None
) -> list[Score | None]:
    """``oracle.score`` of every config, in order; forked worker processes when many."""
    return list(predict_iter(oracle, configs, workers=workers))


def predict_iter(
    oracle: SimOracle,
    configs: Sequence[TrialConfig],
    *,
    workers: int | None = None,
    deadline: float | None = None,
) -> Iterator[Score | None]:
    """``predict_all`` one result at a time: a consumer that stops early (an interrupt)
    leaves the configs not yet started unpredicted, and so does ``deadline`` (a
    ``time.monotonic()`` value): the results end there, without waiting for the
    predictions under way."""
    slots, distinct = modelled_alike(oracle, configs, deadline=deadline)
    workers = workers or default_workers()
    if len(distinct) < PARALLEL_ABOVE or workers < 2:
        results: Iterator[Score | None] = (
            oracle.score(config)
            for config in distinct
            if deadline is None or time.monotonic() < deadline
        )
    else:
        results = forked_map(
            _score_in_worker, distinct, state=oracle, workers=workers, deadline=deadline
        )
    scored: list[Score | None] = []
    for slot in slots:  # a config's distinct one is never later than the configs before it
        while len(scored) <= slot:
            found = next(results, _STOPPED)
            if found is _STOPPED:
                return
            scored.append(found)  # type: ignore[arg-type]  # not _STOPPED: checked above
        yield scored[slot]


def modelled_alike(
    oracle: SimOracle, configs: Sequence[TrialConfig], *, deadline: float | None = None
) -> tuple[list[int], list[TrialConfig]]:
    """The configs the simulator models differently, in order of first appearance, and
    for each of ``configs`` the index of the one that stands for it (fp8_e4m3 and
    fp8_e5m2 KV, say: the same bytes and speed, so one prediction serves both); at
    ``deadline`` (``time.monotonic()``) it stops, with the slots of the configs before."""
    index: dict[object, int] = {}
    slots: list[int] = []
    distinct: list[TrialConfig] = []
    for config in configs:
        if deadline is not None and time.monotonic() >= deadline:
            break
        sim = oracle.sim_config(config)
        key: object = tuple(config.vllm_args()) if sim is None else sim.as_modelled()
        if key not in index:
            index[key] = len(distinct)
            distinct.append(config)
        slots.append(index[key])
    return slots, distinct
