"""Launch an OpenAI-compatible server process, wait until it serves, watch it, stop it.

Shared by ``VllmEngine`` and ``SimEngine``: they only build the argv and the
environment. While waiting for ``/health`` and ``/v1/models`` the log is read
every poll, so a doomed start ends as soon as the server says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from autotune.config.trial_config import TrialConfig
from autotune.engines.base import PhaseCallback, Server
from autotune.engines.process import ServerProcess, free_port
from autotune.engines.vllm_log import (
    classify_failure,
    fatal_line,
    memory_held_elsewhere,
    parse_startup_log,
)
from autotune.errors import ReplayError, ServerStartFailed
from autotune.replay.metrics import parse_metrics
from autotune.vocabulary import Failure, FailureClass, StartupReport

POLL_S = 0.25
# Each readiness and health poll: /health and /v1/models answer in milliseconds, and a
# poll that times out is only a miss (the next comes POLL_S or HEALTH_MONITOR_S later),
# so a hung server cannot hold the launcher; the start's own limit is startup_timeout_s.
HTTP_TIMEOUT_S = 5.0
FATAL_EXIT_GRACE_S = 5.0  # after a decisive log line, time for the traceback to finish
HEALTH_MONITOR_S = 2.0
PORT_RETRIES = 2
GPU_RELEASE_WAIT_S = 10.0  # a dead server's GPU memory is back within seconds (scaled on sim)

# Startup phases in the order vLLM logs them: (log text, phase name).
PHASES = (
    ("Initializing a V1 LLM engine", "initializing engine"),
    ("Starting to load model", "loading model"),
    ("Loading model from scratch", "loading model"),
    ("Loading weights took", "profiling memory"),
    ("KV cache size:", "kv cache allocated"),
    ("Capturing CUDA graphs", "capturing graphs"),
    ("Starting vLLM server on", "starting api server"),
    ("Application startup complete", "api ready"),
)

ArgvForPort = Callable[[int], Sequence[str]]


class ProcessServer(Server):
    """A server process that answered /health and /v1/models."""

    def __init__(
        self,
        *,
        process: ServerProcess,
        url: str,
        report: StartupReport,
        served_model_name: str,
        time_scale: float,
        api_key: str | None,
        serving_log_offset: int,
        launched_at: float,
        lockstep: bool = False,
    ) -> None:
        self.process = process
        self.url = url
        self.report = report
        self.log_path = process.log_path
        self.served_model_name = served_model_name
        self.time_scale = time_scale
        self.api_key = api_key
        self.lockstep = lockstep
        self._serving_log_offset = serving_log_offset
        self._health_status: int | None = None
        self._failure: Failure | None = None
        self._stopping = False
        self._launched_at = launched_at  # time.monotonic() at launch

    @property
    def argv(self) -> list[str]:
        return self.process.argv

    def poll_failure(self) -> Failure | None:
        """A failure seen while serving: process gone, fatal log line, /health 503."""
        if self._failure is not None or self._stopping:
            return self._failure
        serving_log = self.process.log_text()[self._serving_log_offset :]
        exit_code = self.process.exit_code()
        dead = self._health_status == 503 or exit_code is not None
        if dead or fatal_line(serving_log, phase="serving"):
            failure = classify_failure(
                serving_log, exit_code=exit_code, health_status=self._health_status, phase="serving"
            )
            self._failure = failure.model_copy(
                update={"seconds": round(time.monotonic() - self._launched_at, 3)}
            )
        return self._failure

    async def monitor_health(self, client: httpx.AsyncClient) -> None:
        """Poll /health while serving; a 503 marks the engine dead (read by poll_failure)."""
        while True:
            await asyncio.sleep(HEALTH_MONITOR_S)
            with contextlib.suppress(httpx.HTTPError):
                status = (await client.get(f"{self.url}/health")).status_code
                if status == 503 or self._health_status != 503:
                    self._health_status = status

    async def stop(self) -> None:
        self._stopping = True
        await self.process.stop()


class _Watcher:
    """Reads the log during startup: phases for ``on_phase``, decisive failure lines."""

    def __init__(self, on_phase: PhaseCallback | None) -> None:
        self._on_phase = on_phase
        self._seen: set[str] = set()

    def phase(self, name: str) -> None:
        if name not in self._seen:
            self._seen.add(name)
            if self._on_phase is not None:
                self._on_phase(name)

    def read(self, log_text: str) -> str | None:
        for needle, name in PHASES:
            if needle in log_text:
                self.phase(name)
        return fatal_line(log_text, phase="startup")


def api_key_of(config: TrialConfig, env: Mapping[str, str]) -> str | None:
    """The API key the server will demand: ``--api-key`` (first one) or VLLM_API_KEY."""
    value = config.flag("api-key")
    if isinstance(value, list):
        value = value[0] if value else None
    if value is not None:
        return str(value)
    return env.get("VLLM_API_KEY") or None


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _status(client: httpx.AsyncClient, url: str, headers: Mapping[str, str]) -> int | None:
    try:
        return (await client.get(url, headers=dict(headers))).status_code
    except httpx.HTTPError:
        return None


async def _served_model_name(
    client: httpx.AsyncClient, url: str, api_key: str | None
) -> str | None:
    try:
        response = await client.get(f"{url}/v1/models", headers=_auth_headers(api_key))
        if response.status_code != 200:
            return None
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None


async def _cross_check_capacity(
    client: httpx.AsyncClient, url: str, report: StartupReport
) -> StartupReport:
    """Fill KV capacity fields from vllm:cache_config_info (the log wins where both exist)."""
    try:
        response = await client.get(f"{url}/metrics")
        found = parse_metrics(response.text).get("vllm:cache_config_info")
    except (httpx.HTTPError, ReplayError):
        return report
    if not found:
        return report
    labels = found[0].labels
    update: dict[str, int] = {}
    for field, label in (
        ("kv_cache_blocks", "num_gpu_blocks"),
        ("block_size", "block_size"),
        ("kv_cache_tokens", "kv_cache_size_tokens"),
    ):
        with contextlib.suppress(KeyError, ValueError):
            if getattr(report, field) is None:
                update[field] = int(float(labels[label]))
    return report.model_copy(update=update)


async def _wait_ready(
    process: ServerProcess,
    client: httpx.AsyncClient,
    *,
    url: str,
    api_key: str | None,
    startup_timeout_s: float,
    watcher: _Watcher,
) -> tuple[str, float]:
    """Served model name and seconds to ready; raises ServerStartFailed."""
    started = time.monotonic()

    def failed(exit_code: int | None, note: str = "") -> ServerStartFailed:
        failure = classify_failure(
            process.log_text(), exit_code=exit_code, health_status=None, phase="startup"
        )
        update: dict[str, object] = {"seconds": round(time.monotonic() - started, 3)}
        if note:
            update["message"] = note
        return ServerStartFailed(failure.model_copy(update=update))

    while True:
        decisive = watcher.read(process.log_text())
        if decisive is not None:
            raise failed(await process.wait_exit(FATAL_EXIT_GRACE_S))
        exit_code = process.exit_code()
        if exit_code is not None:
            raise failed(exit_code)
        if await _status(client, f"{url}/health", {}) == 200:
            name = await _served_model_name(client, url, api_key)
            if name is not None:
                return name, time.monotonic() - started
        if time.monotonic() - started > startup_timeout_s:
            timed_out = failed(None)
            if timed_out.failure.failure_class == FailureClass.STARTUP_TIMEOUT:
                note = f"not ready after {startup_timeout_s:g} s: {timed_out.failure.message}"
                raise failed(None, note)
            raise timed_out
        await asyncio.sleep(POLL_S)


@asynccontextmanager
async def launch_process_server(
    argv_for_port: ArgvForPort,
    *,
    env: Mapping[str, str],
    log_path: Path,
    startup_timeout_s: float,
    on_phase: PhaseCallback | None,
    time_scale: float,
    api_key: str | None,
    host: str = "127.0.0.1",
    notes: Sequence[str] = (),
    lockstep: bool = False,
) -> AsyncIterator[ProcessServer]:
    """Start the server on a free port, wait until it serves, yield it, stop its session.

    Retries on a fresh port when the chosen one was taken in the meantime. ``notes``
    (e.g. what version gating changed) head the log, after the argv. ``lockstep``: the
    server is the simulator, whose clock a replay may hold.
    Raises ``ServerStartFailed`` with the classified ``Failure``.
    """
    launched_at = time.monotonic()
    watcher = _Watcher(on_phase)
    watcher.phase("launching")
    retry_notes: list[str] = []
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, trust_env=False) as client:
        for attempt in range(PORT_RETRIES + 2):
            port = free_port(host)
            argv = list(argv_for_port(port))
            preamble = [f"argv: {shlex.join(argv)}", *notes, *retry_notes]
            process = ServerProcess.start(argv, env=env, log_path=log_path, preamble=preamble)
            url = f"http://{host}:{port}"
            try:
                name, ready_s = await _wait_ready(
                    process,
                    client,
                    url=url,
                    api_key=api_key,
                    startup_timeout_s=startup_timeout_s,
                    watcher=watcher,
                )
            except ServerStartFailed as exc:
                await process.stop()
                port_taken = exc.failure.failure_class == FailureClass.PORT_IN_USE
                if port_taken and attempt < PORT_RETRIES:
                    continue
                # Not this config's OOM: wait once for the memory to come back, then retry.
                held = memory_held_elsewhere(exc.failure)
                if held and not retry_notes:
                    retry_notes.append(f"retried: the first start failed because {held}")
                    await asyncio.sleep(max(GPU_RELEASE_WAIT_S / time_scale, POLL_S))
                    continue
                raise
            except BaseException:
                await asyncio.shield(process.stop())
                raise
            break
        log_text = process.log_text()
        report = parse_startup_log(log_text).model_copy(update={"ready_s": round(ready_s, 3)})
        report = await _cross_check_capacity(client, url, report)
        server = ProcessServer(
            process=process,
            url=url,
            report=report,
            served_model_name=name,
            time_scale=time_scale,
            api_key=api_key,
            serving_log_offset=len(log_text),
            launched_at=launched_at,
            lockstep=lockstep,
        )
        watcher.phase("ready")
        monitor = asyncio.create_task(server.monitor_health(client))
        try:
            yield server
        finally:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
            await asyncio.shield(server.stop())
