"""Is the load, not the config, setting a study's throughput? Then the configs tie.

A workload whose timing is the limit (two Claude Code sessions, each waiting on its
recorded think times) gives every config the same throughput: the server idles between
turns whatever its flags. Crowning one of them, or ranking flags by importance over a
constant, tells the user nothing. Two readings say so:

- the offered load: what the workload would give an instant server under the same load
  (the load policy's schedule with every request answered as it is sent), known from
  the study's workload. Every config that serves ``OFFERED_SHARE`` of it or more has at
  most the rest to gain, and single runs at such a load scatter by that much (two real
  Claude Code sessions offering 34.6 tok/s: configs at 31.5-34.7 in single runs), so
  two or more such configs tie, whatever their spread;
- without it (the workload file gone or changed), the spread alone: the distinct configs
  measured (at least ``MIN_CONFIGS``) all served within ``TIE_SPREAD`` of the best (a
  run's own noise on a load that is not the limit, about 3%).

Load-bound, the way out is more load (more sessions at once, shorter think times, a
larger workload), not another config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.replay.load_policy import LoadPolicy
from autotune.results.reader import LoadedStudy
from autotune.results.study_inputs import study_plan
from autotune.workload.plan import WorkloadPlan

TIE_SPREAD = 0.03  # configs within this share of the best tie: one run's noise
OFFERED_SHARE = 0.90  # a best this close to what the load offers has nothing left to gain
MIN_CONFIGS = 3  # fewer distinct configs cannot show a tie by their spread alone
MIN_BOUND_CONFIGS = 2  # ... nor fewer than this one by the offered load


def offered_output_tok_s(plan: WorkloadPlan, load: LoadSpec) -> float | None:
    """Output tok/s of the replay's window if every request were answered the moment it is
    sent (the schedule alone: gaps, arrivals, the budget). None when the load sets no
    bound (a closed loop without gaps sends its next request at once)."""
    policy = LoadPolicy(plan, load)
    tokens = 0
    while (at_s := policy.next_send_s()) is not None:
        for send in policy.due(at_s):
            output_tokens = send.request.output_tokens
            if policy.completed(at_s, output_tokens):
                tokens += output_tokens
            policy.finished(send, at_s)
    window_s = policy.window_duration_s()
    return tokens / window_s if window_s else None


@dataclass(frozen=True)
class Tie:
    """The configs a study measured, all within ``TIE_SPREAD`` of each other."""

    configs: int  # distinct configs that tie (within the limits)
    low_tok_s: float  # the lowest tied config's mean
    high_tok_s: float  # the best config's mean
    offered_tok_s: float | None  # what the load offers an instant server (None: unknown)
    load: LoadSpec
    sessions: int
    measured: int = 0  # distinct configs measured within the limits (0: as many as tie)

    @property
    def spread(self) -> float:
        return 1 - self.low_tok_s / self.high_tok_s

    @property
    def load_bound(self) -> bool:
        """The best config already serves (nearly) all the load offers."""
        return self.offered_tok_s is not None and self.high_tok_s >= (
            OFFERED_SHARE * self.offered_tok_s
        )


def find_tie(loaded: LoadedStudy, offered_tok_s: float | None) -> Tie | None:
    """The tie among the study's measured configs, or None (too few, or they differ)."""
    if loaded.multi_objective or loaded.info.primary_objective != "throughput":
        return None
    by_config: dict[str, list[float]] = {}
    for row in loaded.feasible_measured():
        if row.values and row.config is not None:
            key = json.dumps(row.flags, sort_keys=True, default=str)
            by_config.setdefault(key, []).append(row.values[0])
    means = [sum(values) / len(values) for values in by_config.values()]
    if not means or max(means) <= 0:
        return None
    tied = means
    if offered_tok_s and max(means) >= OFFERED_SHARE * offered_tok_s:
        tied = [mean for mean in means if mean >= OFFERED_SHARE * offered_tok_s]
        if len(tied) < MIN_BOUND_CONFIGS:
            return None
    elif len(means) < MIN_CONFIGS or min(means) < (1 - TIE_SPREAD) * max(means):
        return None
    return Tie(
        configs=len(tied),
        low_tok_s=min(tied),
        high_tok_s=max(tied),
        offered_tok_s=offered_tok_s,
        load=LoadSpec.model_validate(loaded.info.load),
        sessions=int(loaded.info.workload.get("sessions") or 0),
        measured=len(means),
    )


def study_tie(loaded: LoadedStudy) -> Tie | None:
    """``find_tie`` with the offered load of the study's own workload when it is still
    there unchanged (else the tie alone)."""
    offered = None
    try:
        plan, load = study_plan(loaded)
        offered = offered_output_tok_s(plan, load)
    except InputError:
        pass
    return find_tie(loaded, offered)


def more_load_advice(tie: Tie) -> str:
    """How to give the configs something to differ on, for this load's mode."""
    load = tie.load
    gap = f", or --max-gap under {load.max_gap_s:g}s" if load.max_gap_s else ", or --max-gap 5s"
    faster = f"--timing-scale above {load.timing_scale:g}{gap}"
    if load.mode == "sessions" and tie.sessions and tie.sessions <= load.concurrency:
        return (
            f"the workload has {tie.sessions} sessions, no more than --concurrency "
            f"{load.concurrency}: use a workload with more sessions (autotune workload gen "
            f"claudecode --sessions 32, or record more) or shorten the think times ({faster})"
        )
    if load.mode == "sessions":
        return (
            f"raise --concurrency (now {load.concurrency} sessions at once) or shorten the "
            f"think times ({faster})"
        )
    if load.mode == "trace":
        return f"replay the arrivals faster ({faster}) or use a larger workload"
    return f"raise --concurrency (now {load.concurrency}) or use a larger workload"


def tie_sentences(tie: Tie) -> list[str]:
    """The plain words: the configs tie, and (load-bound) why and what to do."""
    some = tie.measured not in (0, tie.configs)
    which = f"{tie.configs} of the {tie.measured}" if some else f"all {tie.configs}"
    which = "both" if which == "all 2" else which
    served = f"{which} configs measured served {tie.low_tok_s:,.1f}-{tie.high_tok_s:,.1f}"
    served += " output tok/s"
    if tie.load_bound:
        assert tie.offered_tok_s is not None
        return [
            f"The configs tie: {served}, and the workload offers "
            f"{tie.offered_tok_s:,.1f} with an instant server (the best: "
            f"{tie.high_tok_s / tie.offered_tok_s:.0%} of it; each of them at least "
            f"{OFFERED_SHARE:.0%}, closer than single runs at this load tell apart). The "
            f"load, not the config, sets the throughput here, so the crown is a coin toss: "
            f"{more_load_advice(tie)}."
        ]
    figures = f"{served} ({tie.spread:.1%} apart, within a run's noise)"
    return [
        f"The configs tie: {figures}. No flag of the space moved the throughput measurably "
        f"on this workload, so the crown is a coin toss; to tell them apart under more load: "
        f"{more_load_advice(tie)}."
    ]
