"""How long each trial replays, and how long it may run before it is given up.

With neither ``--duration`` nor ``load.max_requests`` (docs/tuner.md) a trial replays the whole
workload. A long recorded trace (hundreds of 100k-token agent requests) makes
that many modelled hours per trial, so one trial would eat a night. The
pre-flight predicts the baseline config's replay once on the simulator and, when
it runs past ``CAP_ABOVE_S``, caps each trial at ``DEFAULT_REPLAY_BUDGET_S``.

A server that hangs (stopped, deadlocked) must not stall the study: without
``--trial-timeout`` each trial gets a ``TrialTimeLimit`` sized from the replay's
predicted length (``size_trial_limit``), counted from when its server is ready
(the start has its own limit, ``--startup-timeout``). A trial past it ends as
``trial-timeout`` and its server's process group is killed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from autotune.config.space import SearchSpace
from autotune.replay.load import LoadSpec
from autotune.tuner.predictor import SimOracle
from autotune.workload.plan import WorkloadPlan

# A whole-workload replay predicted longer than this is capped (modelled seconds).
CAP_ABOVE_S = 20 * 60
# The cap: 10 modelled minutes reach a steady state at the default 8 sessions even with
# 100k-token prompts (a few requests per session), and with the server start make about
# 12 minutes a trial on real hardware: some 40 trials in an 8-hour night.
DEFAULT_REPLAY_BUDGET_S = 10 * 60

# The default limit is this many times the baseline's predicted replay (wall): the
# uncalibrated simulator's prediction of a real GPU can be off by 2x, and a config slower
# than the baseline replays longer; one three times slower is far behind anyway.
REPLAY_LIMIT_FACTOR = 3
# ... and at least this long (wall): a short replay's fixed costs (the template probes,
# the slowest last requests) and a simulator starved of CPU are not in the prediction.
MIN_REPLAY_LIMIT_S = 3 * 60
# Without a simulator prediction the length is a budget or the recorded gaps (a lower
# bound that leaves out serving time), so the limit is never below an hour.
UNPREDICTED_MIN_REPLAY_LIMIT_S = 60 * 60
NO_ORACLE_WHY = "--hardware and --sim-model let the simulator predict it"


class TrialTimeLimit(BaseModel):
    """How long one trial may run before it ends as ``trial-timeout``, its server killed.

    Stored with the study's run options, so a resume and its workers use the same.
    """

    model_config = ConfigDict(frozen=True)

    seconds: float  # wall seconds
    from_ready: bool  # counted from the server being ready (default), else from the launch
    basis: str  # why this long, in words: "3x the predicted 4m replay"
    # The replay it is sized from, wall seconds (None: unknown): the live ETA's trial length.
    replay_wall_s: float | None = None

    def line(self, *, stored: bool = False) -> str:
        """The run's line that states the limit."""
        if not self.from_ready:
            return f"Trial time limit: {_clock(self.seconds)}, start included ({self.basis})."
        where = "; as the study stored it" if stored else ""
        return (
            f"Trial time limit: {_clock(self.seconds)} once the server is ready "
            f"({self.basis}{where}; --trial-timeout to change)."
        )


def size_replay(
    load: LoadSpec,
    plan: WorkloadPlan,
    *,
    space: SearchSpace,
    model: str,
    engine_version: str | None,
    oracle: SimOracle | None,
) -> tuple[LoadSpec, str | None]:
    """``load`` with a replay budget when the user set none and the whole workload is long,
    and the pre-flight line that says so (None when nothing is said)."""
    if load.duration_s is not None or load.max_requests is not None:
        return load, None
    predicted = _predicted_replay_s(plan, space, model, engine_version, oracle)
    if predicted is None:
        recorded = _recorded_replay_s(plan, load)
        if recorded is None or recorded <= CAP_ABOVE_S:
            return load, None
        length, source = recorded, "recorded"
    elif predicted <= CAP_ABOVE_S:
        return load, None
    else:
        length, source = predicted, "predicted on the simulator"
    capped = load.model_copy(update={"duration_s": float(DEFAULT_REPLAY_BUDGET_S)})
    return capped, (
        f"trial length {_clock(DEFAULT_REPLAY_BUDGET_S)}: the whole workload "
        f"({len(plan.requests):,} requests) replays in about {_clock(length)} ({source}), "
        "too long for one trial (set --duration to change it)."
    )


def size_trial_limit(
    load: LoadSpec,
    plan: WorkloadPlan,
    *,
    space: SearchSpace,
    model: str,
    engine_version: str | None,
    oracle: SimOracle | None,
    time_scale: float,
    no_oracle_why: str = NO_ORACLE_WHY,
) -> TrialTimeLimit:
    """The default limit for trials replaying ``plan`` under ``load`` (the load they run,
    budget included; ``oracle`` predicts under it). ``time_scale``: the simulator's
    speed-up, so that a modelled length becomes wall seconds (1 for a real engine).
    ``no_oracle_why``: why there is no ``oracle``, for the line that says so."""
    predicted = _predicted_replay_s(plan, space, model, engine_version, oracle)
    if predicted is not None:
        wall_s = predicted / time_scale
        seconds = max(REPLAY_LIMIT_FACTOR * wall_s, MIN_REPLAY_LIMIT_S)
        basis = f"{REPLAY_LIMIT_FACTOR}x the predicted {_clock(wall_s)} replay"
        if seconds == MIN_REPLAY_LIMIT_S:
            basis += f", at least {_clock(MIN_REPLAY_LIMIT_S)}"
        return TrialTimeLimit(seconds=seconds, from_ready=True, basis=basis, replay_wall_s=wall_s)
    if load.duration_s is not None:
        wall_s, source = load.duration_s / time_scale, "replay budget"
    else:
        recorded = _recorded_replay_s(plan, load)
        wall_s, source = (recorded or 0.0) / time_scale, "recorded"
    seconds = max(REPLAY_LIMIT_FACTOR * wall_s, UNPREDICTED_MIN_REPLAY_LIMIT_S)
    if seconds > UNPREDICTED_MIN_REPLAY_LIMIT_S:
        basis = f"{REPLAY_LIMIT_FACTOR}x the {_clock(wall_s)} {source}, no simulator prediction"
    else:
        why = no_oracle_why if oracle is None else "the simulator cannot model the baseline config"
        basis = (
            f"at least {_clock(UNPREDICTED_MIN_REPLAY_LIMIT_S)} without a predicted replay "
            f"length: {why}"
        )
    return TrialTimeLimit(
        seconds=seconds, from_ready=True, basis=basis, replay_wall_s=wall_s or None
    )


def _predicted_replay_s(
    plan: WorkloadPlan,
    space: SearchSpace,
    model: str,
    engine_version: str | None,
    oracle: SimOracle | None,
) -> float | None:
    """The baseline config's whole replay in modelled seconds, on the simulator."""
    if oracle is None or not plan.requests:
        return None
    config = space.to_config(space.baseline_params(engine_version), model=model)
    prediction = oracle.predict(config)
    if prediction is None or not prediction.records:
        return None
    return max(r.send_s + (r.e2e_s or 0.0) for r in prediction.records)


def _recorded_replay_s(plan: WorkloadPlan, load: LoadSpec) -> float | None:
    """Without a simulator model: the recorded span (trace mode) or the longest session's
    gaps (sessions mode), a lower bound that ignores the time spent serving."""
    if not plan.requests:
        return None
    if load.mode == "trace":
        return max(r.arrival_s for r in plan.requests) / load.timing_scale
    if load.mode != "sessions":
        return None
    gaps: dict[str, float] = {}
    for request in plan.requests:
        gap = request.gap_s / load.timing_scale
        gap = gap if load.max_gap_s is None else min(gap, load.max_gap_s)
        key = request.session or request.id
        gaps[key] = gaps.get(key, 0.0) + gap
    sessions = sorted(gaps.values(), reverse=True)
    # concurrency sessions at once: the total over the slots, at least the longest one.
    return max(sessions[0], sum(sessions) / load.concurrency)


def _clock(seconds: float) -> str:
    """45s, 12m, 1h05m, 18h20m."""
    if seconds < 90:
        return f"{round(seconds)}s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"
