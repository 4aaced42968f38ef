"""How long each trial replays: the whole workload, or a default budget when that is long.

With neither ``--duration`` nor ``load.max_requests`` (docs/tuner.md) a trial replays the whole
workload. A long recorded trace (hundreds of 100k-token agent requests) makes
that many modelled hours per trial, so one trial would eat a night. The
pre-flight predicts the baseline config's replay once on the simulator and, when
it runs past ``CAP_ABOVE_S``, caps each trial at ``DEFAULT_REPLAY_BUDGET_S``.
"""

from __future__ import annotations

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
    """12m, 1h05m, 18h20m."""
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"
