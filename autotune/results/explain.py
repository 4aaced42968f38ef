"""Plain-words explanations computed from a study's trials: nothing here is canned.

Each function returns sentences built from measured figures: what the best
config gained over the baseline and through which flags, which flags did not
matter (Optuna's parameter importances over the measured trials), and where
out-of-memory began along each numeric flag.
"""

from __future__ import annotations

import statistics
import warnings
from collections import Counter
from collections.abc import Iterable
from typing import Any

import optuna
from pydantic import BaseModel, ConfigDict

from autotune.replay.metrics import prefix_cache_shares
from autotune.results.load_bound import Tie, study_tie, tie_sentences
from autotune.results.reader import LoadedStudy, TrialRow
from autotune.sim.model.units import GIB
from autotune.vocabulary import OOM_OUTCOMES, Outcome

UNIMPORTANT_SHARE = 0.05  # a parameter with under 5% of the importance "did not matter"
LOW_CONCURRENCY_REQUESTS = 8  # the field notes' split for where MTP pays off
FULL_KV_USAGE = 0.95  # a KV pool this full evicts cached prefixes
LONG_LIST = 6  # lists longer than this are shortened in sentences
MIN_TRIALS_FOR_IMPORTANCE = 5  # PED-ANOVA's docs ask for at least 5 good trials; fewer is noise
# Our own failures (autotune's, not the server's) say nothing about memory.
NOT_RUN = frozenset({None, Outcome.OWN_ERROR, Outcome.STORAGE_ERROR, Outcome.INTERRUPTED})


class Section(BaseModel):
    model_config = ConfigDict(frozen=True)

    title: str
    sentences: tuple[str, ...]


def format_flag_value(name: str, value: Any) -> str:
    """A flag value for people: byte counts in GiB, dicts compact, long lists shortened."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if name.endswith("-bytes") and isinstance(value, int | float):
        return f"{gib_text(value / GIB)} GiB"
    if isinstance(value, dict):
        return ", ".join(f"{k}={format_flag_value(k, v)}" for k, v in value.items())
    if isinstance(value, list) and len(value) > LONG_LIST:
        head = ", ".join(str(v) for v in value[:3])
        return f"[{head}, ..., {value[-1]}] ({len(value)} values)"
    return str(value)


def gib_text(gib: float) -> str:
    """``12.0`` -> ``"12"``, ``11.25`` -> ``"11.25"``: exact enough to act on."""
    return f"{gib:.2f}".rstrip("0").rstrip(".")


def mtp_tokens(row: TrialRow) -> int:
    """Speculative tokens per step (0: no speculative decoding)."""
    spec = row.flags.get("speculative-config")
    if isinstance(spec, dict):
        return int(spec.get("num_speculative_tokens") or 0)
    return 0


def kv_pool_gib(row: TrialRow) -> float | None:
    value = row.flags.get("kv-cache-memory-bytes")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value / GIB
    return row.startup.kv_cache_gib if row.startup else None


def measured_study(loaded: LoadedStudy, *, feasible_only: bool = True) -> optuna.Study:
    """An in-memory copy in which only measured trials count, so placeholder values do not.

    Every other trial is copied as FAIL (which plots and importances skip), so
    trial numbers stay those of the stored study.
    """
    copy = optuna.create_study(directions=loaded.study.directions)
    rows = loaded.feasible_measured() if feasible_only else loaded.trials
    keep = {row.number for row in rows if row.measured and row.values}
    copy.add_trials(
        [
            trial
            if trial.number in keep
            else optuna.trial.create_trial(
                state=optuna.trial.TrialState.FAIL,
                params=trial.params,
                distributions=trial.distributions,
            )
            for trial in loaded.study.get_trials(deepcopy=False)
        ]
    )
    return copy


def param_importances(loaded: LoadedStudy) -> dict[str, float]:
    """Optuna's importances (PED-ANOVA) over measured feasible trials, first objective."""
    if len(loaded.feasible_measured()) < MIN_TRIALS_FOR_IMPORTANCE:
        return {}
    study = measured_study(loaded)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # too few trials above the quantile: still usable
        try:
            return optuna.importance.get_param_importances(study, target=lambda t: t.values[0])
        except (ValueError, RuntimeError):  # e.g. every parameter held one value
            return {}


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def outcome_sentences(loaded: LoadedStudy) -> list[str]:
    counts = Counter(row.outcome or row.state.lower() for row in loaded.trials)
    parts = [f"{n} {outcome}" for outcome, n in counts.most_common()]
    oom = sum(n for outcome, n in counts.items() if outcome in OOM_OUTCOMES)
    sentences = [f"{len(loaded.trials)} trials: {', '.join(parts)}."]
    if oom:
        sentences.append(f"{oom} of them ran out of GPU memory (or were predicted to).")
    return sentences


def headline_sentences(loaded: LoadedStudy, best: TrialRow) -> list[str]:
    objective = loaded.info.primary_objective
    value = loaded.value_of(best)
    winner = loaded.crowned()
    runs = ""
    if winner is not None and winner.measurements > 1:
        runs = f" (the mean of {winner.measurements} runs)"
    sentence = (
        f"The best config is trial {best.number}: {objective} "
        f"{value if value is not None else float('nan'):,.2f}{runs}"
    )
    baseline = loaded.baseline()
    gain = loaded.gain_over_baseline(best)
    if baseline is not None and baseline.number == best.number:
        return [sentence + "; it is the baseline itself: no trial has beaten it yet."]
    if baseline is None:
        return [sentence + "; the study has no baseline trial to compare with."]
    if gain is None:
        return [
            sentence + f"; the baseline (trial {baseline.number}) ended {baseline.outcome} "
            "and produced no measurement to compare with."
        ]
    base_value = baseline.values[0] if baseline.values else float("nan")
    return [
        sentence + f", {gain:.2f}x the baseline's {base_value:,.2f} (trial {baseline.number}), "
        "measured."
    ]


def pareto_sentences(loaded: LoadedStudy) -> list[str]:
    """For multi-objective studies: the trade-off the Pareto front offers."""
    if not loaded.multi_objective:
        return []
    front = sorted(loaded.pareto(), key=loaded.primary_key, reverse=True)
    if not front:
        return []
    names = loaded.info.objectives or tuple(f"objective {i}" for i in range(2))

    def values_text(row: TrialRow) -> str:
        pairs = zip(names, row.values or (), strict=False)
        return ", ".join(f"{name} {value:,.2f}" for name, value in pairs)

    points = "; ".join(f"trial {row.number}: {values_text(row)}" for row in front)
    if len(front) == 1:
        return [f"One trial beats or equals every other on all objectives: {points}."]
    return [
        f"The Pareto front holds {len(front)} trials, each better than the others on at "
        f"least one objective: {points}. The best is the one first on {names[0]}; "
        f"export another with {loaded.command('export', '--trial', str(front[1].number))} "
        "(or pick by a limit with --slo)."
    ]


def _capacity_sentences(best: TrialRow, baseline: TrialRow) -> list[str]:
    sentences: list[str] = []
    dtype_best = best.flags.get("kv-cache-dtype", "auto")
    dtype_base = baseline.flags.get("kv-cache-dtype", "auto")
    gib_best, gib_base = kv_pool_gib(best), kv_pool_gib(baseline)
    tokens_best, tokens_base = best.kv_cache_tokens, baseline.kv_cache_tokens
    if gib_best and gib_base and tokens_best and tokens_base:
        per_gib_best, per_gib_base = tokens_best / gib_best, tokens_base / gib_base
        if dtype_best != dtype_base:
            sentences.append(
                f"KV cache dtype {dtype_best} stored {per_gib_best:,.0f} tokens per GiB against "
                f"{per_gib_base:,.0f} with {dtype_base} ({_ratio(per_gib_best, per_gib_base)})."
            )
        if abs(gib_best - gib_base) > 0.05:
            sentences.append(
                f"The KV pool went from {gib_text(gib_base)} GiB to {gib_text(gib_best)} GiB."
            )
    if tokens_best and tokens_base and tokens_best != tokens_base:
        reach = ""
        ran, ran_base = best.concurrency_reached, baseline.concurrency_reached
        if ran is not None and ran_base is not None:
            if (ran - ran_base) * (tokens_best - tokens_base) > 0:  # both moved the same way
                reach = (
                    f", which let {ran} requests run at once against {ran_base} for the baseline"
                )
            else:
                reach = (
                    f"; it did not set how many requests ran at once ({ran} against "
                    f"{ran_base} for the baseline)"
                )
        sentences.append(
            f"KV capacity went from {tokens_base:,} to {tokens_best:,} tokens "
            f"({_ratio(tokens_best, tokens_base)}){reach}."
        )
    cap = best.flags.get("max-num-seqs")
    if isinstance(cap, int) and best.concurrency_reached is not None:
        if best.concurrency_reached >= cap:
            sentences.append(f"max-num-seqs {cap} was the limit: all {cap} slots were in use.")
        else:
            sentences.append(
                f"max-num-seqs {cap} was not the limit: at most {best.concurrency_reached} "
                "requests ran at once (KV capacity or the offered load held it lower)."
            )
    return sentences


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


def mtp_sentences(loaded: LoadedStudy, best: TrialRow) -> list[str]:
    """Where speculative decoding paid off, per running request, split by concurrency."""
    rows = [r for r in loaded.trials if r.measured and r.throughput_tok_s and r.concurrency_reached]
    if not any(mtp_tokens(r) for r in rows) or all(mtp_tokens(r) for r in rows):
        return []
    sentences = []
    split = LOW_CONCURRENCY_REQUESTS
    for label, keep in (
        (f"at {split} or fewer running requests", lambda r: r.concurrency_reached <= split),
        (f"above {split} running requests", lambda r: r.concurrency_reached > split),
    ):
        with_mtp = _mean(_per_request(r) for r in rows if keep(r) and mtp_tokens(r))
        without = _mean(_per_request(r) for r in rows if keep(r) and not mtp_tokens(r))
        if with_mtp and without:
            verdict = "paid off" if with_mtp > without else "did not pay off"
            sentences.append(
                f"MTP {verdict} {label}: trials with it made {with_mtp:,.1f} output tok/s per "
                f"running request against {without:,.1f} without ({_ratio(with_mtp, without)})."
            )
    k = mtp_tokens(best)
    stats = best.server_stats
    if k and stats and stats.spec_decode_acceptance_rate is not None:
        sentences.append(
            f"The best config drafts {k} token(s) per step; "
            f"{stats.spec_decode_acceptance_rate:.0%} of draft tokens were accepted."
        )
    elif not k:
        sentences.append("The best config runs without speculative decoding.")
    return sentences


def _per_request(row: TrialRow) -> float:
    return (row.throughput_tok_s or 0.0) / max(1, row.concurrency_reached or 1)


def changed_flag_sentences(best: TrialRow, baseline: TrialRow) -> list[str]:
    names = [
        n for n in {**baseline.flags, **best.flags} if best.flags.get(n) != baseline.flags.get(n)
    ]
    if not names:
        return ["The best config launches with the same flags as the baseline."]
    changes = [
        f"{name} {format_flag_value(name, baseline.flags.get(name))} -> "
        f"{format_flag_value(name, best.flags.get(name))}"
        for name in names
    ]
    return [f"Against the baseline it changes: {'; '.join(changes)}."]


def prefix_cache_sentences(best: TrialRow) -> list[str]:
    """The prefix-cache hit rate, and when it is 0%, which of the usual causes the data shows."""
    stats = best.server_stats
    if stats is None or stats.prefix_cache_hit_rate is None:
        return []
    rate = stats.prefix_cache_hit_rate
    _, external = prefix_cache_shares(stats) or (rate, None)
    extra = f", plus {external:.0%} from the external (LMCache) tier" if external else ""
    if rate > 0 and external:  # shares of the same prompt tokens: they add up
        gpu_pct, external_pct = round(100 * rate), round(100 * external)
        return [
            f"The prefix cache served {gpu_pct + external_pct}% of prompt tokens: "
            f"{gpu_pct}% from GPU memory and {external_pct}% from the external (LMCache) tier."
        ]
    if rate > 0:
        return [f"The prefix cache served {rate:.0%} of prompt tokens."]
    if best.flags.get("enable-prefix-caching") is False:
        return [f"Prefix cache hit rate was 0%{extra}: prefix caching is off in this config."]
    usage, preemptions = stats.peak_kv_cache_usage, stats.preemptions
    if usage is not None and usage >= FULL_KV_USAGE:
        evidence = f"peak KV usage {usage:.0%}" + (
            f", {preemptions} preemptions" if preemptions else ""
        )
        return [
            f"Prefix cache hit rate was 0%{extra} with prefix caching on: the KV pool was full "
            f"({evidence}), so cached prefixes were evicted before they could be reused."
        ]
    return [
        f"Prefix cache hit rate was 0%{extra} with prefix caching on and room in the KV pool "
        f"(peak usage {_percent(usage)}): the requests share no prefix long enough to cache "
        f"(a full block of {stats.block_size or '?'} tokens)."
    ]


def _percent(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0%}"


def importance_sentences(loaded: LoadedStudy, tie: Tie | None = None) -> list[str]:
    measured = len(loaded.feasible_measured())
    if tie is not None and tie.measured in (0, tie.configs):  # importances over a constant
        return [
            f"None measurably: over {measured} measured trials every config served within "
            f"{tie.spread:.1%} of the best, so ranking the flags by importance would rank noise."
        ]
    importances = param_importances(loaded)
    if not importances:
        return [
            f"Too few measured trials ({measured}, fewer than {MIN_TRIALS_FOR_IMPORTANCE}) "
            "to rank the flags by importance."
        ]
    ranked = sorted(importances.items(), key=lambda item: -item[1])
    top = ", ".join(f"{name} {share:.0%}" for name, share in ranked if share >= UNIMPORTANT_SHARE)
    sentences = [f"Importance over {measured} measured trials: {top}."]
    minor = [name for name, share in ranked if share < UNIMPORTANT_SHARE]
    if minor:
        objective = loaded.info.primary_objective
        sentences.append(
            f"Barely moved {objective} across these trials (under {UNIMPORTANT_SHARE:.0%} of "
            f"the importance each): {', '.join(minor)}. That is a statement about the "
            "objective over the trials measured, not about memory or capacity."
        )
    return sentences


def _numeric_params(rows: list[TrialRow]) -> list[str]:
    seen: dict[str, set[float]] = {}
    for row in rows:
        for name, value in row.params.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                seen.setdefault(name, set()).add(float(value))
    return sorted(name for name, values in seen.items() if len(values) > 1)


def _param_text(name: str, value: Any) -> str:
    if name.endswith("_gib") and isinstance(value, int | float):
        return f"{gib_text(value)} GiB"
    return format_flag_value(name, value)


def like_for_like_boundaries(rows: list[TrialRow], name: str) -> list[tuple[TrialRow, TrialRow]]:
    """(largest that fitted, smallest that OOMed) among trials whose every other parameter
    is equal, where the two separate cleanly: only then does ``name`` alone decide."""
    groups: dict[str, list[TrialRow]] = {}
    for row in rows:
        if isinstance(row.params.get(name), int | float):
            others = {key: value for key, value in row.params.items() if key != name}
            groups.setdefault(repr(sorted(others.items())), []).append(row)
    pairs = []
    for group in groups.values():
        fitted = [r for r in group if not r.is_oom]
        oomed = [r for r in group if r.is_oom]
        if fitted and oomed:
            top_fit = max(fitted, key=lambda r: r.params[name])
            low_oom = min(oomed, key=lambda r: r.params[name])
            if top_fit.params[name] < low_oom.params[name]:
                pairs.append((top_fit, low_oom))
    return pairs


def _boundary_sentence(name: str, fit: TrialRow, oom: TrialRow) -> str:
    others = ", ".join(
        f"{key} {_param_text(key, value)}" for key, value in fit.params.items() if key != name
    )
    return (
        f"Out-of-memory began on {name} between {_param_text(name, fit.params[name])} "
        f"(trial {fit.number}, fitted) and {_param_text(name, oom.params[name])} "
        f"(trial {oom.number}, {oom.outcome}), every other parameter equal ({others})."
    )


def oom_sentences(loaded: LoadedStudy) -> list[str]:
    """Where OOM began, drawn only between trials that differ in that one parameter."""
    rows = [r for r in loaded.trials if r.config is not None and r.outcome not in NOT_RUN]
    ooms = [r for r in rows if r.is_oom]
    if not rows:
        return ["No configuration has reached the engine or the memory model yet."]
    if not ooms:
        return [f"None of the {len(rows)} configurations tried ran out of memory."]
    numbers = ("trial " if len(ooms) == 1 else "trials ") + ", ".join(str(r.number) for r in ooms)
    if len(ooms) == len(rows):
        return [f"Every trial ran out of memory ({numbers}); none fitted to bracket the boundary."]
    sentences = [
        _boundary_sentence(name, fit, oom)
        for name in _numeric_params(rows)
        for fit, oom in like_for_like_boundaries(rows, name)
    ]
    if not sentences:
        sentences.append(
            f"{len(ooms)} {'trial' if len(ooms) == 1 else 'trials'} ran out of memory "
            f"({numbers}), but none differs from a "
            "trial that fitted in one parameter alone, so these trials cannot say which "
            "flag decides."
        )
    return sentences


def explain(loaded: LoadedStudy) -> list[Section]:
    """Every section of the explanation, computed from the study's trials."""
    sections = [Section(title="Trials", sentences=tuple(outcome_sentences(loaded)))]
    if not loaded.feasible_measured():
        sections.append(
            Section(title="Best", sentences=("No trial completed within its constraints yet.",))
        )
        memory = oom_sentences(loaded)
        sections.append(Section(title="Where out-of-memory begins", sentences=tuple(memory)))
        return sections
    best = loaded.best()
    tie = study_tie(loaded)
    if tie is not None:
        sections.append(Section(title="The configs tie", sentences=tuple(tie_sentences(tie))))
    why = headline_sentences(loaded, best) + pareto_sentences(loaded)
    baseline = loaded.baseline()
    if baseline is not None and baseline.config is not None and baseline.number != best.number:
        why += changed_flag_sentences(best, baseline)
        if baseline.measured or baseline.startup:
            why += _capacity_sentences(best, baseline)
    why += mtp_sentences(loaded, best)
    why += prefix_cache_sentences(best)
    sections.append(Section(title="Why the best config wins", sentences=tuple(why)))
    sections.append(
        Section(title="Which flags mattered", sentences=tuple(importance_sentences(loaded, tie)))
    )
    sections.append(
        Section(title="Where out-of-memory begins", sentences=tuple(oom_sentences(loaded)))
    )
    return sections
