"""Run ONE configuration end to end: pre-screen, launch, replay, scrape, stop.

Knows nothing of Optuna: the study, ``autotune try`` and any benchmark of
search strategies all run trials through ``run_trial``. A server that fails
is a result (``TrialResult.failure``), never an exception.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autotune.config.space import SearchSpace
from autotune.config.trial_config import TrialConfig
from autotune.defaults import DEFAULT_STARTUP_TIMEOUT_S
from autotune.engines.base import BaseEngine
from autotune.errors import ServerStartFailed
from autotune.replay.load import LoadSpec, ReplayObserver, RequestSlo
from autotune.replay.load_policy import Progress
from autotune.replay.records import ReplayStats, RequestRecord
from autotune.replay.runner import replay
from autotune.vocabulary import Failure, FailureClass, Outcome, ServerStats, StartupReport
from autotune.workload.plan import WorkloadPlan

TIMEOUT_LOG_TAIL_LINES = 20  # of the server's log, kept with a timed-out trial
TIMEOUT_LOG_TAIL_BYTES = 16_384  # read from the log's end: a long log costs nothing more


@dataclass(frozen=True)
class MemoryEstimate:
    """The memory model's view of a config before launch."""

    fits: bool
    margin: float  # needed / available - 1: negative when it fits
    report: dict[str, Any]


Prescreen = Callable[[TrialConfig], MemoryEstimate | None]


class TrialObserver(ReplayObserver, Protocol):
    """Progress hooks for one trial (phases, then each finished request)."""

    def on_phase(self, phase: str) -> None: ...


@dataclass
class TrialResult:
    """Everything one trial measured or learned, whatever its outcome."""

    config: TrialConfig
    argv: list[str] | None = None
    startup: StartupReport | None = None
    stats: ReplayStats | None = None
    server_stats: ServerStats | None = None
    records: list[RequestRecord] = field(default_factory=list)
    failure: Failure | None = None
    memory: MemoryEstimate | None = None
    outcome_override: str | None = None  # predicted-oom, trial-timeout ...
    log_path: Path | None = None
    wall_s: float = 0.0
    rule_violations: list[str] = field(default_factory=list)  # the space's rules it breaks


def derive_config(
    space: SearchSpace,
    params: dict[str, Any],
    *,
    model: str,
    engine_version: str | None,
    reported_block_size: int | None = None,
    prescreen: Prescreen | None = None,
) -> TrialConfig:
    """The TrialConfig for ``params``, with the attention block size N that 2N-1 needs.

    N depends on the config itself (KV dtype, MTP k): the memory model's value for
    this config when there is one, else the last value an engine reported.
    """
    config = space.to_config(
        params, model=model, engine_version=engine_version, attention_block_size=reported_block_size
    )
    estimate = prescreen(config) if prescreen is not None else None
    modelled = estimate.report.get("attention_block_size") if estimate else None
    if modelled and modelled != reported_block_size and space.reads_block_size(params):
        config = space.to_config(
            params, model=model, engine_version=engine_version, attention_block_size=modelled
        )
    return config


async def run_trial(
    config: TrialConfig,
    *,
    engine: BaseEngine,
    plan: WorkloadPlan,
    load: LoadSpec,
    log_path: Path,
    slo: RequestSlo | None = None,
    prescreen: Prescreen | None = None,
    skip_predicted_oom: bool = True,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    trial_timeout_s: float | None = None,
    replay_timeout_s: float | None = None,
    observer: TrialObserver | None = None,
    on_progress: Callable[[Progress], bool] | None = None,
) -> TrialResult:
    """Launch ``config`` on ``engine``, replay ``plan`` under ``load``, stop the server.

    ``prescreen`` estimates memory first; with ``skip_predicted_oom`` a config it
    rejects is scored as predicted-oom without a launch. ``on_progress`` sees the
    replay's throughput so far and may stop it (see ``replay``); the server is
    stopped as usual.

    Time limits (wall seconds, None: none): ``trial_timeout_s`` from the launch,
    ``replay_timeout_s`` from the server being ready (its start is bounded by
    ``startup_timeout_s``). Past either the outcome is trial-timeout: a hung server
    answers nothing, and this limit is what ends its trial.

    The server is stopped (its whole process group) before this returns, also
    on cancellation (Ctrl-C).
    """
    started = time.monotonic()
    result = TrialResult(config=config, log_path=log_path)
    result.memory = prescreen(config) if prescreen is not None else None
    if skip_predicted_oom and result.memory is not None and not result.memory.fits:
        result.outcome_override = Outcome.PREDICTED_OOM.value
        result.wall_s = time.monotonic() - started
        return result

    log_path.parent.mkdir(parents=True, exist_ok=True)
    phases = ["launching"]  # what the server was doing, for a timeout's failure

    def phase(text: str) -> None:
        phases.append(text)
        if observer is not None:
            observer.on_phase(text)

    try:
        async with asyncio.timeout(trial_timeout_s) as whole_trial:
            await _launch_and_replay(
                result,
                engine=engine,
                plan=plan,
                load=load,
                slo=slo,
                startup_timeout_s=startup_timeout_s,
                replay_timeout_s=replay_timeout_s,
                on_phase=phase,
                observer=observer,
                on_progress=on_progress,
            )
    except TimeoutError:
        result.outcome_override = Outcome.TRIAL_TIMEOUT.value
        if whole_trial.expired():
            limit = f"the trial time limit of {trial_timeout_s:g} s (--trial-timeout)"
        elif replay_timeout_s is not None:
            limit = f"the replay time limit of {replay_timeout_s:g} s, counted from ready"
        else:
            limit = "a time limit"
        result.failure = timeout_failure(
            limit, phases[-1], log_path, seconds=time.monotonic() - started
        )
    result.wall_s = time.monotonic() - started
    return result


def timeout_failure(limit: str, phase: str, log_path: Path, *, seconds: float) -> Failure:
    """Why a trial was stopped at its time limit: the limit, the server's last phase and
    its log's tail (the server's process group was killed)."""
    tail = ""
    if log_path.exists():
        with log_path.open("rb") as log:
            log.seek(max(log.seek(0, 2) - TIMEOUT_LOG_TAIL_BYTES, 0))
            tail = log.read().decode(errors="replace")
    return Failure(
        failure_class=FailureClass.UNKNOWN,
        message=f"stopped at {limit}, while {phase}; its process group was killed",
        log_excerpt="\n".join(tail.splitlines()[-TIMEOUT_LOG_TAIL_LINES:]),
        seconds=round(seconds, 3),
    )


async def _launch_and_replay(
    result: TrialResult,
    *,
    engine: BaseEngine,
    plan: WorkloadPlan,
    load: LoadSpec,
    slo: RequestSlo | None,
    startup_timeout_s: float,
    replay_timeout_s: float | None,
    on_phase: Callable[[str], None] | None,
    observer: ReplayObserver | None,
    on_progress: Callable[[Progress], bool] | None = None,
) -> None:
    if on_phase is not None:
        on_phase("launching")
    assert result.log_path is not None
    try:
        async with engine.launch(
            result.config,
            log_path=result.log_path,
            startup_timeout_s=startup_timeout_s,
            on_phase=on_phase,
        ) as server:
            result.argv = getattr(server, "argv", None)
            result.startup = server.report
            if on_phase is not None:
                on_phase("replaying")
            async with asyncio.timeout(replay_timeout_s):  # the stop below kills the group
                replayed = await replay(
                    url=server.url,
                    plan=plan,
                    load=load,
                    model_name=server.served_model_name,
                    server_time_scale=server.time_scale,
                    api_key=server.api_key,
                    slo=slo,
                    observer=observer,
                    on_progress=on_progress,
                    lockstep=server.lockstep,
                )
            result.records = replayed.records
            result.stats = replayed.stats
            result.server_stats = replayed.server_stats
            result.failure = server.poll_failure()
    except ServerStartFailed as exc:
        result.failure = exc.failure
        # No server handle: record the config's own argv (host and port aside).
        result.argv = result.argv or result.config.vllm_args()
