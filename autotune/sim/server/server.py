"""``python -m autotune.sim serve``: the simulated ``vllm serve`` process.

One process plays vLLM's API server and EngineCore: it binds the port first
(as vLLM does, so a busy port fails at once), logs vLLM's startup lines over
a realistic modelled startup, then serves the OpenAI / Anthropic endpoints
from the engine core in scaled wall time. A run-time OOM or an injected crash
kills the engine as vLLM's does: fatal-error lines, in-flight requests fail,
/health turns 503, and the process exits 0 shortly after (vLLM's watchdog).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

import uvicorn

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.errors import InputError
from autotune.sim.model.calibration_profile import profile_constants
from autotune.sim.model.memory import MemoryReport, plan_memory
from autotune.sim.model.scheduler import SimEngineCore
from autotune.sim.server import logs
from autotune.sim.server.api import SimApi
from autotune.sim.server.faults import FaultInjector, claim_scheduled_faults
from autotune.sim.server.flags import ServeArgs, parse_serve_args
from autotune.sim.server.logs import VllmLog
from autotune.sim.server.metrics_export import CacheInfo, VllmMetrics
from autotune.sim.server.scaled_time_loop import EngineRunner
from autotune.sim.server.startup import StartupSequence
from autotune.sim.server.stats_log import StatsLogger

WATCHDOG_S = 5.0  # vLLM's launcher checks engine health every 5 s: scaled, but >= 1 s wall
MIN_WATCHDOG_WALL_S = 1.0  # so a client can still see /health 503 before the exit
ENGINE_PID_OFFSET = 1  # the EngineCore "pid" in log lines (one process plays both)


def main(argv: list[str]) -> int:
    """Run the simulator server for a ``serve`` argv (without ``serve``); the exit code.

    Bad arguments: argparse's usage error on stderr and 2, as ``vllm serve``.
    """
    scheduled = claim_scheduled_faults(os.environ)
    if scheduled:
        print(f"(simulator) faults scheduled for this launch: {' '.join(scheduled)}", flush=True)
    try:
        args = parse_serve_args([*argv, *scheduled])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return asyncio.run(serve(args))


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says TCP, and without it Nagle + delayed ACKs hold SSE chunks ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def serve(args: ServeArgs) -> int:
    """Start up (logging as vLLM), serve until stopped or the engine dies; the exit code."""
    pid = os.getpid()
    log = VllmLog(api_pid=pid, engine_pid=pid + ENGINE_PID_OFFSET)
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        code = exc.errno or errno.EADDRINUSE
        log.raw(
            logs.traceback_text(
                (
                    (
                        "<site-packages>/vllm/entrypoints/launchers/api_server/entry.py",
                        161,
                        "setup_server",
                        "sock = create_server_socket(sock_addr)",
                    ),
                ),
                f"OSError: [Errno {code}] {reason}",
            )
        )
        return 1
    with contextlib.closing(sock):
        return await _run(args, log, sock)


async def _run(args: ServeArgs, log: VllmLog, sock: socket.socket) -> int:
    model = get_model(args.sim.model)
    gpu = get_gpu(args.sim.hardware)
    try:
        memory: MemoryReport | None = plan_memory(
            args.sim, held_bytes=args.faults.gpu_memory_held_bytes
        )
    except InputError as exc:  # rejected while vLLM builds its config
        memory, rejection = None, str(exc)
    startup = StartupSequence(args, log, model=model, gpu=gpu, memory=memory)
    await startup.api_process()
    if args.faults.env_error is not None:
        name = args.faults.env_error
        error = f"ValueError: invalid setting {name}={os.environ.get(name, '')!r}"
        log.raw(logs.traceback_text(logs.CONFIG_FRAMES, error))
        return 1
    if memory is None:
        startup.rejected(rejection)
        return 1
    if args.faults.hang_at_startup:
        log.engine("gpu_model_runner.py:4979", f"Starting to load model {args.sim.model}...")
        await asyncio.Event().wait()  # never: the tuner's startup timeout must catch it
    if not memory.fits:
        await startup.engine_until_loaded()
        await startup.fail()
        return 1
    await startup.engine_until_loaded()
    await startup.engine_until_ready()
    await asyncio.sleep(startup.phases.server_s / args.time_scale)
    startup.serving_lines(args.host, sock.getsockname()[1])  # the real port, even for --port 0
    server: uvicorn.Server | None = None

    def on_crash(root_cause: str) -> None:
        _log_engine_death(log, root_cause)
        loop = asyncio.get_running_loop()
        delay_s = max(WATCHDOG_S / args.time_scale, MIN_WATCHDOG_WALL_S)
        loop.call_later(delay_s, _stop, server)

    def on_startup() -> None:
        log.raw("INFO:     Waiting for application startup.")
        log.raw("INFO:     Application startup complete.")

    api = build_api(args, on_crash=on_crash, on_startup=on_startup)
    runner = api.runner
    config = uvicorn.Config(
        api.app(),
        log_config=None,
        log_level=logging.CRITICAL,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    stats = StatsLogger(runner, log, interval_s=10.0, enabled=not args.disable_log_stats)
    engine_task = asyncio.create_task(runner.run())
    stats_task = asyncio.create_task(stats.run())
    # uvicorn re-raises a captured SIGINT/SIGTERM after shutdown; a no-op handler makes
    # that harmless, so a stopped server exits 0 as vLLM does.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    log.raw(f"INFO:     Started server process [{os.getpid()}]")
    try:
        await server.serve(sockets=[sock])
    finally:
        engine_task.cancel()
        stats_task.cancel()
    _log_shutdown(log, runner.dead)
    sys.stdout.flush()
    return 0


def build_api(
    args: ServeArgs,
    *,
    on_crash: Callable[[str], None],
    on_startup: Callable[[], None] = lambda: None,
) -> SimApi:
    """The engine core, its metrics, faults and run loop, behind the HTTP routes.

    The run loop is not started: ``api.runner.run()`` is the caller's task.
    """
    constants, _ = profile_constants(args.calibration, args.sim)
    core = SimEngineCore(args.sim, seed=args.sim.seed, noise=args.noise, constants=constants)
    memory = core.memory
    metrics = VllmMetrics(
        model_name=args.served_model_name, num_speculative_tokens=args.sim.num_speculative_tokens
    )
    metrics.set_cache_info(
        CacheInfo(
            block_size=memory.block_size,
            cache_dtype=args.sim.kv_cache_dtype,
            enable_prefix_caching=memory.enable_prefix_caching,
            gpu_memory_utilization=args.sim.gpu_memory_utilization,
            kv_cache_memory_bytes=args.sim.kv_cache_memory_bytes,
            kv_cache_size_tokens=memory.kv_cache_tokens,
            kv_cache_max_concurrency=memory.max_concurrency,
            num_gpu_blocks=memory.num_gpu_blocks,
            mamba_block_size=memory.attention_block_size,
        )
    )
    faults = FaultInjector(args.faults, seed=args.sim.seed)
    runner = EngineRunner(
        core,
        time_scale=args.time_scale,
        metrics=metrics,
        faults=faults,
        on_crash=on_crash,
        seed=args.sim.seed,
    )
    return SimApi(
        args, runner, metrics, faults, max_model_len=memory.max_model_len, on_startup=on_startup
    )


def _stop(server: uvicorn.Server | None) -> None:
    if server is not None:
        server.should_exit = True


def _log_engine_death(log: VllmLog, root_cause: str) -> None:
    """What vLLM prints when the engine core dies while serving."""
    log.engine(
        "core.py:1591",
        "EngineCore encountered a fatal error.\n"
        + logs.traceback_text(logs.ENGINE_BUSY_FRAMES, root_cause),
        level="ERROR",
    )
    log.api(
        "core_client.py:722",
        "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
        level="ERROR",
    )
    log.api(
        "async_llm.py:943",
        "AsyncLLM output_handler failed.\n"
        + logs.traceback_text(logs.OUTPUT_HANDLER_FRAMES, logs.ENGINE_DEAD_ERROR),
        level="ERROR",
    )


def _log_shutdown(log: VllmLog, engine_dead: bool) -> None:
    log.api("launcher.py:254", "[shutdown] API server: shutdown triggered")
    log.api(
        "launcher.py:270", "[shutdown] API server: stopping engine client mode=abort timeout=0s"
    )
    if not engine_dead:
        log.engine("core.py:1454", "[shutdown] EngineCore: trigger received signal=SIGTERM")
    log.api("launcher.py:304", "[shutdown] API server: shutting down FastAPI HTTP server")
    log.raw("INFO:     Shutting down")
    log.raw("INFO:     Waiting for application shutdown.")
    log.raw("INFO:     Application shutdown complete.")
