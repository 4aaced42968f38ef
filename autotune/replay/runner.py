"""One replay over HTTP: the driver, the server's metrics around it, and the result.

``replay`` drives one server with one WorkloadPlan under one LoadSpec and
returns every RequestRecord, their ReplayStats and the server's ServerStats.

Clocks: the plan's times (gaps, arrivals) are modelled seconds; the runner
waits ``t / load.timing_scale / server_time_scale`` wall seconds, and the
client multiplies what it measures by ``server_time_scale``, so records and
stats are in modelled seconds whatever the simulator's speed-up. With
``lockstep`` (the simulator only) the replay runs on the simulator's own clock
instead (``lockstep_driver.py``): the same policy, no wall clock in any figure.

What is sent when, the budget (no request sent after ``load.duration_s``
modelled or after ``load.max_requests`` sends; requests in flight finish), the
warm-up and measurement windows and the saturation verdict are the load
policy's (``load_policy.py``), shared with the simulator's virtual replay.

Progress: every ``PROGRESS_STEP_PCT`` of the budget, ``on_progress`` gets the
window's output throughput so far; when it answers True the run stops as on
saturation (the study prunes a hopeless trial this way).

Early stop: when the waiting queue grows without bound (the server's
``vllm:num_requests_waiting`` rising over successive scrapes, or in trace
mode the client's own backlog of unanswered requests) or the server stops
accepting connections, sending stops, requests in flight are abandoned
(not recorded) and ``ReplayStats.stopped_early`` says why.

A stopped or hung server (it takes connections but answers nothing): every call
has a timeout (``client.py``, ``metrics.py``), and with ``unanswered_limit_s``
(``autotune replay``) the replay gives up with ``ServerNotAnswering`` when the
server does not answer the first ``GET /v1/models`` or leaves ``/metrics``
unanswered that long. A trial passes None: its time limit decides
(``trial-timeout``, trial.py), so a hang is never scored as a measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx
from pydantic import BaseModel

from autotune.errors import ReplayError, ServerNotAnswering
from autotune.http_transport import AiohttpTransport
from autotune.replay.client import CALL_TIMEOUT, fetch_model_name
from autotune.replay.http_driver import HttpDriver
from autotune.replay.load import LoadSpec, ReplayObserver, RequestSlo
from autotune.replay.load_policy import Progress
from autotune.replay.lockstep_driver import LockstepDriver
from autotune.replay.metrics import gauge_lines, parse_metrics, scrape, server_stats_between
from autotune.replay.records import ReplayStats, RequestRecord
from autotune.replay.stats import compute_stats
from autotune.replay.token_check import check_prompt_tokens, measure_plan_overheads
from autotune.vocabulary import ServerStats
from autotune.workload.plan import WorkloadPlan

MIN_SCRAPE_INTERVAL_S = 0.25  # wall: a time-scaled server is still scraped at most this often
SATURATION_CHECK_S = 1.0  # wall: client-backlog checks when /metrics is not scraped
# `autotune replay` gives up on a server whose /metrics has answered nothing for this long
# (wall). vLLM's API server answers it in milliseconds while its GPU prefills for minutes
# (the engine runs in another process), so a minute of silence is no slow GPU: the server
# is stopped or hung. Several scrapes (SCRAPE_TIMEOUT_S each) fail before it passes.
UNANSWERED_LIMIT_S = 60.0


def _wall_interval_s(scrape_interval_s: float | None, server_time_scale: float) -> float:
    # Modelled seconds to wall seconds, but never so often that scraping loads the server.
    if scrape_interval_s is None:
        return SATURATION_CHECK_S
    return max(scrape_interval_s / server_time_scale, MIN_SCRAPE_INTERVAL_S)


class ReplayResult(BaseModel):
    """Everything one replay measured."""

    records: list[RequestRecord]
    stats: ReplayStats
    server_stats: ServerStats | None


async def _sample(
    driver: HttpDriver, client: httpx.AsyncClient, *, url: str, scraping: bool, samples: list[str]
) -> ServerNotAnswering | None:
    """One reading of /metrics (kept for the peaks); stop the run on saturation. Returns
    the error when the server did not answer the scrape at all."""
    waiting: int | None = None
    if scraping:
        try:
            kept = gauge_lines(await scrape(client, url))
            queued = parse_metrics(kept).get("vllm:num_requests_waiting")
        except ServerNotAnswering as exc:
            return exc  # a missed scrape only loses a peak sample
        except ReplayError:
            return None  # an answer, if not Prometheus text
        samples.append(kept)
        if queued is not None:
            waiting = round(sum(sample.value for sample in queued))
    reason = driver.policy.saturation(waiting, driver.in_flight)
    if reason is not None:
        driver.stop(reason)
    return None


class _Silence:
    """Since when the server has answered nothing (wall clock)."""

    def __init__(self) -> None:
        self._since = time.monotonic()

    def answered(self) -> None:
        self._since = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self._since

    def reason(self, url: str, missed: ServerNotAnswering) -> str:
        return (
            f"the server at {url} stopped answering: nothing from /metrics for "
            f"{self.seconds():.0f} s, the last try: {missed}; is it stopped (SIGSTOP) or hung?"
        )


async def _monitor(
    driver: HttpDriver,
    client: httpx.AsyncClient,
    *,
    url: str,
    interval_s: float,
    scraping: bool,
    samples: list[str],
    unanswered_limit_s: float | None,
    silence: _Silence,
) -> str | None:
    """Scrape /metrics every ``interval_s`` (wall); stop the run on saturation, or when
    /metrics has not answered for ``unanswered_limit_s`` (then return why)."""
    while True:
        await asyncio.sleep(interval_s)
        missed = await _sample(driver, client, url=url, scraping=scraping, samples=samples)
        if missed is None:
            silence.answered()
            continue
        if unanswered_limit_s is not None and silence.seconds() >= unanswered_limit_s:
            reason = silence.reason(url, missed)
            driver.stop(reason)
            return reason


async def _probe(client: httpx.AsyncClient, api_key: str | None) -> None:
    """Raise ServerNotAnswering when the server takes the connection but does not answer
    ``GET /v1/models``; any answer, or a refused connection, is left to the replay."""
    try:
        await fetch_model_name(client, api_key=api_key)
    except ServerNotAnswering:
        raise
    except ReplayError:
        return


async def replay(
    *,
    url: str,
    plan: WorkloadPlan,
    load: LoadSpec,
    model_name: str,
    server_time_scale: float = 1.0,
    api_key: str | None = None,
    slo: RequestSlo | None = None,
    observer: ReplayObserver | None = None,
    scrape_interval_s: float | None = 5.0,
    transport: httpx.AsyncBaseTransport | None = None,
    on_progress: Callable[[Progress], bool] | None = None,
    unanswered_limit_s: float | None = None,
    lockstep: bool = False,
) -> ReplayResult:
    """Replay ``plan`` against the server at ``url`` (e.g. ``http://127.0.0.1:8000``).

    ``model_name`` empty: the first model at /v1/models. ``scrape_interval_s``
    (modelled seconds, at most every 0.25 s wall): how often /metrics is read during
    the run for peaks and saturation; None: /metrics is not read (server_stats None).
    Raises ReplayError only when the replay cannot start (no model name) or, with
    ``unanswered_limit_s``, the server stopped answering; request failures are records.
    ``transport``: httpx transport (default: ``AiohttpTransport``, see transport.py).
    ``on_progress``: the window's throughput so far (see the module docstring); True
    stops the run, with ``stopped_early`` saying so.
    ``unanswered_limit_s`` (wall seconds; None: off): raise ServerNotAnswering when the
    server does not answer ``GET /v1/models`` at the start (within the call timeout)
    or leaves /metrics unanswered this long during the run. ``lockstep``: the server is
    the simulator, and the replay holds its clock (figures independent of the host's load).
    """
    if server_time_scale <= 0:
        raise ReplayError(f"server_time_scale must be > 0, but got {server_time_scale}")
    transport = transport if transport is not None else AiohttpTransport()
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=CALL_TIMEOUT) as client:
        if not model_name:
            model_name = await fetch_model_name(client, api_key=api_key)
        elif unanswered_limit_s is not None:
            await _probe(client, api_key)
        overheads = await measure_plan_overheads(
            client, plan, model_name=model_name, api_key=api_key
        )
        before: str | None = None
        if scrape_interval_s is not None:
            with contextlib.suppress(ReplayError):
                before = await scrape(client, url)
        samples: list[str] = []
        options = dict(
            client=client,
            plan=plan,
            load=load,
            model_name=model_name,
            time_scale=server_time_scale,
            api_key=api_key,
            observer=observer,
            on_progress=on_progress,
        )
        driver: HttpDriver
        if lockstep:
            driver = LockstepDriver(
                sample=lambda: _sample(
                    driver, client, url=url, scraping=before is not None, samples=samples
                ),
                scrape_interval_s=scrape_interval_s or SATURATION_CHECK_S * server_time_scale,
                **options,
            )
        else:
            driver = HttpDriver(**options)  # type: ignore[arg-type]
        monitor: asyncio.Task[str | None] | None = None
        silence = _Silence()
        if not lockstep:  # in lockstep the driver samples, at modelled times
            monitor = asyncio.create_task(
                _monitor(
                    driver,
                    client,
                    url=url,
                    interval_s=_wall_interval_s(scrape_interval_s, server_time_scale),
                    scraping=before is not None,
                    samples=samples,
                    unanswered_limit_s=unanswered_limit_s,
                    silence=silence,
                )
            )
        unanswered: str | None = None
        server_stats = None
        try:
            await driver.run()
            if monitor is not None:
                monitor.cancel()  # no effect on a monitor that returned
                with contextlib.suppress(asyncio.CancelledError):
                    unanswered = await monitor
            if unanswered is None and before is not None:
                try:
                    after = await scrape(client, url)
                    server_stats = server_stats_between(before, after, samples)
                except ServerNotAnswering as exc:
                    if unanswered_limit_s is not None:  # it went silent and stayed so
                        unanswered = silence.reason(url, exc)
                except ReplayError:
                    pass
        finally:
            if monitor is not None and not monitor.done():
                monitor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await monitor
        if isinstance(driver, LockstepDriver):
            # After the last scrape: nothing moved in between. Not on the way out of a
            # cancelled (timed-out) replay: that server is about to be stopped, and a
            # hung one would hold the trial another call timeout.
            await driver.release()
        if unanswered is not None:
            raise ServerNotAnswering(unanswered)
    records = sorted(driver.records, key=lambda record: record.send_s)
    stats = compute_stats(
        records,
        duration_s=driver.policy.window_duration_s(),
        slo=slo,
        itl=driver.itl,
        stopped_early=driver.policy.stop_reason,
    )
    check = check_prompt_tokens(plan, records, overheads)
    stats = stats.model_copy(update={"prompt_tokens_check": check})
    return ReplayResult(records=records, stats=stats, server_stats=server_stats)
