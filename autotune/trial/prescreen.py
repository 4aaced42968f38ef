"""Memory pre-screen: ask the simulator's memory model before launching a config.

A config the model says cannot start is scored as ``predicted-oom`` without a
launch (minutes saved on real hardware). For real engines only a clear miss
counts (``certain_above``): the model is an estimate there.
"""

from __future__ import annotations

import contextlib
import io

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError
from autotune.sim.model.memory import MemoryReport, plan_memory
from autotune.sim.server.flags import parse_serve_args
from autotune.trial.run import MemoryEstimate, Prescreen


def make_prescreen(
    *, hardware: str, sim_model: str, certain_above: float = 0.0, max_prompt_tokens: int = 0
) -> Prescreen:
    """A pre-screen for ``sim_model`` (catalog name) on ``hardware`` (catalog name).

    Two checks: the server must start (weights, activations, CUDA graphs and the
    KV pool fit), and the first full prefill chunk of the workload's longest
    prompt must fit in what is left (the field notes' "starts, then dies under
    load"). ``certain_above``: the memory margin (needed / available - 1) past
    which a predicted OOM is taken as certain; below it the config is launched.
    Raises InputError when either name is not in the catalogs.
    """
    get_gpu(hardware)
    get_model(sim_model)

    def check(config: TrialConfig) -> MemoryEstimate | None:
        report = memory_report(config, sim_model=sim_model, hardware=hardware)
        if report is None:
            return None  # flags the simulator does not model: no opinion
        chunk_tokens = min(report.max_num_batched_tokens, max_prompt_tokens)
        transient = (
            report.transient_prefill_bytes_per_token * chunk_tokens + report.transient_bytes_per_seq
        )
        headroom = report.headroom_bytes - int(transient) if report.fits else report.headroom_bytes
        fits = report.fits and headroom >= 0
        margin = memory_margin(headroom, report.visible_bytes, fits=fits)
        verdict = fits or margin <= certain_above
        details = report.model_dump(mode="json") | {"load_transient_bytes": int(transient)}
        return MemoryEstimate(fits=verdict, margin=margin, report=details)

    return check


def memory_report(config: TrialConfig, *, sim_model: str, hardware: str) -> MemoryReport | None:
    """The memory model's plan for ``config`` as ``sim_model`` on ``hardware`` (catalog
    names), or None when its flags are not ones the simulator models."""
    argv = [sim_model, *config.vllm_args()[1:], "--hardware", hardware]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = parse_serve_args(argv)
    except SystemExit:
        return None
    return plan_memory(args.sim)


def memory_margin(headroom_bytes: int, visible_bytes: int, *, fits: bool) -> float:
    """needed / available - 1: negative with headroom to spare, positive when over."""
    margin = -headroom_bytes / visible_bytes
    if not fits:
        return max(margin, 0.01)
    return min(margin, -0.001)


def try_prescreen(
    *, hardware: str | None, sim_model: str | None, certain_above: float, max_prompt_tokens: int
) -> Prescreen | None:
    """A pre-screen when both names are in the simulator's catalogs, else None."""
    if hardware is None or sim_model is None:
        return None
    try:
        return make_prescreen(
            hardware=hardware,
            sim_model=sim_model,
            certain_above=certain_above,
            max_prompt_tokens=max_prompt_tokens,
        )
    except InputError:
        return None
