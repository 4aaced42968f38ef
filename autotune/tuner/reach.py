"""Whether the limits are in reach: the plain line the warm start prints when no
config of the space is predicted to meet them (e.g. 128k prompts and a 20 s TTFT
on a 32 GB card), naming the limit, the nearest prediction and its config."""

from __future__ import annotations

from autotune.config.trial_config import params_text
from autotune.trial.objective import Goal, Score
from autotune.tuner.guide import Guide

METRIC_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "end-to-end latency"}
SLICE_HINT = (
    "Trials will run the nearest configs; relax the SLO or slice the workload "
    "(autotune workload slice --max-context ...)."
)


def seconds_text(seconds: float) -> str:
    """A latency as people read it: 41.3 s, 850 ms."""
    return f"{seconds:,.1f} s" if seconds >= 1 else f"{seconds * 1000:,.0f} ms"


def out_of_reach(guide: Guide, goal: Goal) -> str | None:
    """The line when nothing predicted is feasible; None when something is (or nothing was
    predicted: the warm start stopped before its first answer)."""
    if guide.predicted or not any(score is not None for score in guide.scores or []):
        return None
    limits = ", ".join(slo.text for slo in goal.slos) or "the limits"
    nearest = guide.nearest()
    if not len(nearest):
        return (
            f"No configuration is predicted to meet {limits}: every one predicted runs out "
            "of memory or fails under this workload. Trials will run anyway; slice the "
            "workload (autotune workload slice --max-context ...) or lower the load."
        )
    index = int(nearest[0])
    score = guide.scores[index] if guide.scores else None
    assert score is not None  # nearest() holds predicted candidates only
    missed = [slo for slo in goal.slos if score.constraints.get(slo.key, 0.0) > 0]
    failing = ", ".join(slo.text for slo in missed) or limits
    candidate = guide.candidates[index]
    config = params_text(candidate.params, dict(candidate.config.flags))  # derived: marked *
    return (
        f"No configuration is predicted to meet {failing}: {_shortfall_text(score, goal)} "
        f"({config}). {SLICE_HINT}"
    )


def _shortfall_text(score: Score, goal: Goal) -> str:
    """The nearest config's predicted values of the limits it misses."""
    parts = []
    for slo in goal.slos:
        margin = score.constraints.get(slo.key, 0.0)
        if margin > 0:
            value = (1 + margin) * slo.limit_s
            words = f"{slo.stat} {METRIC_WORDS[slo.metric]}"
            parts.append(f"the best predicted {words} is {seconds_text(value)}")
    error_rate = score.constraints.get("error_rate", 0.0)
    if error_rate > 0:
        parts.append(f"the lowest predicted error rate is {error_rate + goal.max_error_rate:.1%}")
    return "; ".join(parts) or "the nearest misses a limit"
