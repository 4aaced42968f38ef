"""Does the space's KV range fit the card? The memory model's largest pool, against the bound.

A space written for a 32 GB card caps the KV pool at 13 GiB; on an 80 GB card
that ignores most of the memory. The run says so before the first trial.
"""

from __future__ import annotations

from autotune.config.space import GIB, FloatParam, SearchSpace
from autotune.trial.run import Prescreen, derive_config

KV_FLAG = "kv-cache-memory-bytes"
LOW_SHARE = 0.6  # a bound under this share of the largest pool that starts is worth a word


def largest_kv_pool_bytes(
    space: SearchSpace, *, model: str, engine_version: str | None, prescreen: Prescreen
) -> int | None:
    """The largest KV pool that starts with the baseline's other flags (memory model)."""
    config = derive_config(
        space,
        space.baseline_params(engine_version),
        model=model,
        engine_version=engine_version,
        prescreen=prescreen,
    )
    estimate = prescreen(config)
    if estimate is None:
        return None
    report = estimate.report
    spare = report["headroom_bytes"] - report.get("load_transient_bytes", 0)
    return int(report["kv_cache_bytes"] + spare)


def kv_bound_warning(
    space: SearchSpace, *, model: str, engine_version: str | None, prescreen: Prescreen | None
) -> str | None:
    """One line when the space's KV upper bound is well under what the GPU could hold."""
    found = [
        (name, p)
        for name, p in space.parameters.items()
        if p.flag == KV_FLAG and isinstance(p, FloatParam) and p.unit == "GiB"
    ]
    if prescreen is None or not found:
        return None
    name, param = found[0]
    largest = largest_kv_pool_bytes(
        space, model=model, engine_version=engine_version, prescreen=prescreen
    )
    if largest is None:
        return None
    if param.low * GIB > largest:
        return (
            f"every {name} in the space (from {param.low:g} GiB) is over the largest KV pool the "
            f"memory model says starts on this GPU ({largest / GIB:.1f} GiB): lower its 'low' "
            f"in the space file, or most trials will be predicted OOM"
        )
    if param.high * GIB >= LOW_SHARE * largest:
        return None
    return (
        f"the space caps {name} at {param.high:g} GiB, {param.high * GIB / largest:.0%} of the "
        f"largest KV pool the memory model says starts on this GPU ({largest / GIB:.1f} GiB): "
        f"raise its 'high' in the space file to search the rest of the card"
    )


def shaped(space: SearchSpace, largest_bytes: int, *, low_share: float = 0.3) -> SearchSpace:
    """``space`` with its KV range set to [low_share, 1] x the largest pool that starts."""
    parameters = dict(space.parameters)
    for name, param in space.parameters.items():
        if param.flag == KV_FLAG and isinstance(param, FloatParam) and param.unit == "GiB":
            step = param.step or 0.25
            high = round(largest_bytes / GIB / step) * step
            low = max(step, round(high * low_share / step) * step)
            parameters[name] = param.model_copy(update={"low": low, "high": high})
            baseline = {**space.baseline, name: low}
            space = space.model_copy(update={"baseline": baseline})
    return space.model_copy(update={"parameters": parameters})
