"""Pre-flight: workload, space, model and hardware checked against each other before trial 1.

A night of trials must not be spent discovering that the workload cannot run:
requests longer than the model's native context, than ``--max-model-len``, or
than the largest KV pool the space allows on this GPU; requests for an endpoint
the engine does not serve. ``preflight`` counts every request's context (its
prompt in the engine's own token count plus its output), sizes max-model-len
from the longest one unless the user fixed it, and says what it found and what
the run will do. When more requests are certain to fail than
``--max-error-rate`` allows, no trial could be feasible: it raises InputError.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.catalog.models import ModelSpec
from autotune.config.space import SearchSpace
from autotune.errors import InputError
from autotune.sim.model.kv_layout import DEFAULT_BLOCK_SIZE
from autotune.trial.prescreen import memory_report
from autotune.workload.plan import Endpoint, PlannedRequest, WorkloadPlan

MAX_MODEL_LEN_FLAG = "max-model-len"
KV_SIZING_FLAGS = frozenset({"gpu-memory-utilization"})  # sizes the pool without "kv" in it
# Tokens the replay may add to a recorded prompt (a session salt on recycled sessions).
REPLAY_SLACK_TOKENS = 16
ALL_ENDPOINTS: frozenset[Endpoint] = frozenset(
    {"openai.chat", "openai.completions", "anthropic.messages"}
)

TokenCounter = Callable[[PlannedRequest], int]


@dataclass(frozen=True)
class Target:
    """What the workload will run against."""

    engine: str  # "sim" | "vllm"
    model: str  # as the user named it (catalog name, path or id)
    sim_model: ModelSpec | None  # catalog entry for the memory model, when known
    hardware: str | None  # GPU catalog name, when known
    served_endpoints: frozenset[Endpoint] = ALL_ENDPOINTS
    native_context: int | None = None  # the model's max_position_embeddings, when known


@dataclass(frozen=True)
class Preflight:
    """What the pre-flight found (lines to print) and the max-model-len the run passes."""

    lines: tuple[str, ...]
    max_model_len: int | None  # None: the space or the engine decides


def native_context_of(model: str, sim_model: ModelSpec | None) -> int | None:
    """The model's native context: a local config.json's, else the catalog's, else unknown."""
    config = Path(model).expanduser() / "config.json"
    try:
        raw = json.loads(config.read_text()) if config.is_file() else {}
    except (OSError, json.JSONDecodeError):
        raw = {}
    for section in (raw, raw.get("text_config") or {}):
        value = section.get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    return sim_model.native_max_model_len if sim_model is not None else None


def local_model_endpoints(model: str) -> frozenset[Endpoint]:
    """Endpoints vLLM serves for a local model directory: chat needs a chat template."""
    directory = Path(model).expanduser()
    if not directory.is_dir() or (directory / "chat_template.jinja").is_file():
        return ALL_ENDPOINTS
    try:
        tokenizer = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return ALL_ENDPOINTS
    if tokenizer.get("chat_template"):
        return ALL_ENDPOINTS
    return frozenset({"openai.completions"})


def check_model_path(model: str) -> None:
    """A model named as a local path must exist (an id is the engine's to resolve)."""
    looks_local = model.startswith(("/", "./", "../", "~"))
    if looks_local and not Path(model).expanduser().exists():
        raise InputError(f"--model {model}: no such file or directory")


def round_up(tokens: int, block: int) -> int:
    return math.ceil(tokens / block) * block


def preflight(
    plan: WorkloadPlan,
    space: SearchSpace,
    target: Target,
    *,
    count_prompt_tokens: TokenCounter,
    tokens_per_counted: tuple[float, float] | None = None,
    fixed_max_model_len: int | None,
    max_error_rate: float,
) -> Preflight:
    """Check the workload against the space, model and hardware; size max-model-len.

    ``count_prompt_tokens``: the engine's prompt count for a planned request.
    ``tokens_per_counted``: None when that count is exact; else the (low, high)
    range of real tokens per counted one: a request is certain to fail only at
    the low end, and max-model-len is sized at the high end. Raises
    PreflightFailed when more requests are certain to fail than ``max_error_rate``.
    """
    requests = plan.requests
    if not requests:
        raise InputError(f"workload {plan.name!r}: no requests to replay")
    low, high = tokens_per_counted or (1.0, 1.0)
    counted = [count_prompt_tokens(r) for r in requests]
    needs = [
        math.ceil(c * low) + r.output_tokens + REPLAY_SLACK_TOKENS
        for c, r in zip(counted, requests, strict=True)
    ]
    sized = [
        math.ceil(c * high) + r.output_tokens + REPLAY_SLACK_TOKENS
        for c, r in zip(counted, requests, strict=True)
    ]
    longest = max(range(len(requests)), key=needs.__getitem__)
    estimate = (
        f"; prompt counts are estimates, {low:g}-{high:g} real tokens each"
        if tokens_per_counted
        else ""
    )
    lines = [
        f"Pre-flight: {len(requests)} requests; the longest needs {needs[longest]:,} tokens "
        f"(request {requests[longest].id}, {requests[longest].output_tokens:,} of them "
        f"output{estimate})."
    ]
    limits: list[tuple[str, int]] = []  # (what, tokens): a request needing more fails
    if target.native_context is not None:
        native = target.native_context
        limits.append((f"the model's native context ({native:,})", native))
    block = _block_size(space, target) or DEFAULT_BLOCK_SIZE
    scan_len = min(fixed_max_model_len or needs[longest], target.native_context or needs[longest])
    pool = _largest_pool(space, target, max_model_len=scan_len)
    if pool is not None:
        limits.append((pool[0], pool[1]))
    if fixed_max_model_len is not None:
        limits.append((f"max-model-len {fixed_max_model_len:,} (fixed)", fixed_max_model_len))
        max_model_len = fixed_max_model_len
    else:
        fits = [
            size
            for need, size in zip(needs, sized, strict=True)
            if all(need <= limit for _, limit in limits)
        ]
        cap = min((limit for _, limit in limits), default=None)
        max_model_len = round_up(max(fits, default=needs[longest]), block)
        if cap is not None:
            max_model_len = min(max_model_len, cap)
        lines.append(
            f"max-model-len {max_model_len:,}: the longest request that can run, rounded up to "
            f"the {block}-token block (fix it with max-model-len in the space's fixed:)."
        )
    doomed: set[int] = set()
    too_long: set[int] = set()
    for what, limit in limits:
        over = [i for i, need in enumerate(needs) if need > limit]
        if over:
            doomed.update(over)
            too_long.update(over)
            lines.append(f"{len(over)} of {len(requests)} requests are longer than {what}.")
        else:
            lines.append(f"Every request fits {what}.")
    unserved = [i for i, r in enumerate(requests) if r.endpoint not in target.served_endpoints]
    if unserved:
        doomed.update(unserved)
        endpoints = ", ".join(sorted({requests[i].endpoint for i in unserved}))
        served = ", ".join(sorted(target.served_endpoints))
        lines.append(
            f"{len(unserved)} requests use {endpoints}, which {target.engine} does not serve "
            f"for {target.model} (it serves {served})."
        )
    share = len(doomed) / len(requests)
    if share > max_error_rate:
        lines.append(
            f"{len(doomed)} of {len(requests)} requests ({share:.1%}) would fail in every trial, "
            f"more than --max-error-rate {max_error_rate:g} allows: no trial could be feasible."
        )
        raise PreflightFailed(
            lines,
            f"pre-flight: {len(doomed)} of {len(requests)} requests cannot run on any config of "
            f"this space; {_advice(requests, too_long, set(unserved), limits)}",
        )
    if doomed:
        lines.append(
            f"They will fail and count as errors ({share:.1%}, within --max-error-rate "
            f"{max_error_rate:g})."
        )
    return Preflight(lines=tuple(lines), max_model_len=max_model_len)


def _advice(
    requests: Sequence[PlannedRequest],
    too_long: set[int],
    unserved: set[int],
    limits: list[tuple[str, int]],
) -> str:
    """What to do about the requests that cannot run: the ``workload slice --max-context``
    value that keeps those that can (in the file's own counts, prompt + output, as slice
    counts), when there is one."""
    if not too_long:
        return "drop the requests for endpoints it does not serve, or raise --max-error-rate"
    by_id = {request.id: request for request in requests}
    keep_need: dict[str, int] = {}

    def need_to_keep(request_id: str) -> int:
        # Slice keeps a request when it fits and not every request it waits on was dropped.
        if request_id not in keep_need:
            request = by_id[request_id]
            need = request.prompt_tokens + request.output_tokens
            deps = [dep for dep in request.after if dep in by_id]
            if deps:
                need = max(need, min(need_to_keep(dep) for dep in deps))
            keep_need[request_id] = need
        return keep_need[request_id]

    runnable = [i for i in range(len(requests)) if i not in too_long and i not in unserved]
    if not runnable:
        shortest = min(requests[i].prompt_tokens + requests[i].output_tokens for i in too_long)
        what, limit = min(limits, key=lambda item: item[1])
        return (
            f"no request fits {what}: the shortest needs {shortest:,} tokens, more than "
            f"{limit:,}; slicing cannot help: a larger KV pool (the space), a GPU with more "
            "memory or a model with a longer context can"
        )
    first_doomed = min(need_to_keep(requests[i].id) for i in too_long)
    # Below that every request kept fits; the largest of theirs keeps the same ones.
    kept = [i for i in runnable if need_to_keep(requests[i].id) < first_doomed]
    cut = max((need_to_keep(requests[i].id) for i in kept), default=0)
    note = ""
    if not kept:  # a request that fits counts more in the file than one that does not
        cut = max(need_to_keep(requests[i].id) for i in runnable)
        kept = [i for i in runnable if need_to_keep(requests[i].id) <= cut]
        still = sum(1 for i in too_long if need_to_keep(requests[i].id) <= cut)
        note = f" (and {still} that still cannot: raise --max-error-rate for them)"
    return (
        f"autotune workload slice --max-context {cut} keeps {len(kept)} of the "
        f"{len(runnable)} that can run{note}, or raise --max-error-rate"
    )


class PreflightFailed(InputError):
    """The run cannot be meaningful; ``lines`` say what the pre-flight found."""

    def __init__(self, lines: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.lines = tuple(lines)


def _kv_parameters(space: SearchSpace) -> list[str]:
    """Parameters that size or shape the KV pool (by name or flag)."""
    return [
        name
        for name, param in space.parameters.items()
        if "kv" in name or (param.flag or "") in KV_SIZING_FLAGS or "kv" in (param.flag or "")
    ]


def _block_size(space: SearchSpace, target: Target) -> int | None:
    """The KV block size the engine uses with the baseline (memory model), when known."""
    if target.sim_model is None or target.hardware is None:
        return None
    config = space.to_config(space.baseline_params(), model=target.model)
    try:
        report = memory_report(config, sim_model=target.sim_model.name, hardware=target.hardware)
    except InputError:  # the baseline is rejected before memory is sized: no block size
        return None
    return report.block_size if report is not None else None


def _largest_pool(
    space: SearchSpace, target: Target, *, max_model_len: int
) -> tuple[str, int] | None:
    """(description, tokens): the longest context one request can hold in the largest KV
    pool the space allows that still starts on this GPU (other parameters at the baseline)."""
    if target.sim_model is None or target.hardware is None:
        return None
    grid = space.grid()
    candidates: list[dict] = [space.baseline_params()]
    for name in _kv_parameters(space):
        candidates = [params | {name: value} for params in candidates for value in grid[name]]
    best: tuple[int, dict] | None = None
    for params in candidates:
        flags = {MAX_MODEL_LEN_FLAG: max_model_len}
        config = space.to_config(params, model=target.model)
        config = config.model_copy(update={"flags": config.flags | flags})
        try:
            report = memory_report(
                config, sim_model=target.sim_model.name, hardware=target.hardware
            )
        except InputError:  # a config vLLM rejects before sizing memory
            continue
        if report is None or (report.failure_class or "").startswith("cuda-oom"):
            continue
        tokens = report.longest_context_tokens
        if best is None or tokens > best[0]:
            best = (tokens, params)
    if best is None:
        return None
    shown = ", ".join(f"{name}={best[1][name]}" for name in _kv_parameters(space))
    return (
        f"the largest KV pool the space allows on {target.hardware} "
        f"({shown}: {best[0]:,} tokens for one request)",
        best[0],
    )
