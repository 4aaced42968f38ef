"""Fault injection for the simulator server, so the tuner's failure paths can be tested.

Every fault is opt-in (``--fault-*`` flags) and seeded: the same seed and the
same request order give the same faults. A fault schedule (``FAULT_SCHEDULE_ENV``)
gives each server launch its own faults, so a whole tuning run can be faulted
trial by trial without autotune knowing.
"""

from __future__ import annotations

import fcntl
import os
import random
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

# The root cause logged when --fault-crash-after-requests fires: a text vLLM
# users meet in real engine crashes (CUDA reports it from any kernel).
CRASH_ROOT_CAUSE = (
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, "
    "so the stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)


class FaultConfig(BaseModel):
    """Which faults to inject. Rates are per request, in [0, 1]."""

    model_config = ConfigDict(frozen=True)

    crash_after_requests: int | None = Field(default=None, ge=0)
    hang_at_startup: bool = False
    error_5xx_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    cut_stream_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    slow_first_token_s: float = Field(default=0.0, ge=0.0)  # modelled seconds
    hang_stream_rate: float = Field(default=0.0, ge=0.0, le=1.0)  # stalls, connection open
    malformed_sse_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    never_stream: bool = False  # /health answers, generation requests never do
    gpu_memory_held_bytes: int = Field(default=0, ge=0)  # a previous trial not yet gone
    # At startup, fail with a ValueError quoting this environment variable's value (a plugin
    # that rejects its settings and echoes them): how a key can reach a log by itself.
    env_error: str | None = None


class FaultInjector:
    """Decides, request by request, which fault (if any) strikes. Seeded, per server."""

    def __init__(self, config: FaultConfig, *, seed: int = 0) -> None:
        self.config = config
        self._rng = random.Random(f"faults-{seed}")
        self._finished_requests = 0

    def should_fail_with_5xx(self) -> bool:
        """Whether this request is answered with a 500 instead of being served."""
        rate = self.config.error_5xx_rate
        return rate > 0 and self._rng.random() < rate

    def cut_after_tokens(self, max_tokens: int) -> int | None:
        """After how many streamed tokens this request's stream is cut, or None."""
        rate = self.config.cut_stream_rate
        if rate <= 0 or self._rng.random() >= rate:
            return None
        return self._rng.randint(0, max(0, max_tokens - 1))

    def hangs_mid_stream(self) -> bool:
        """Whether this stream stalls after its first event and never ends."""
        rate = self.config.hang_stream_rate
        return rate > 0 and self._rng.random() < rate

    def sends_malformed_event(self) -> bool:
        """Whether this stream's second event is not JSON (the stream then ends)."""
        rate = self.config.malformed_sse_rate
        return rate > 0 and self._rng.random() < rate

    def request_finished(self) -> None:
        """Count one finished request (see ``crash_due``)."""
        self._finished_requests += 1

    @property
    def crash_due(self) -> bool:
        """Whether --fault-crash-after-requests has been reached: the engine must die."""
        limit = self.config.crash_after_requests
        return limit is not None and self._finished_requests >= limit


# Names a text file: one line per server launch, each line that launch's --fault-*
# flags (an empty line: no fault). Launches take lines in order, across processes.
FAULT_SCHEDULE_ENV = "AUTOTUNE_SIM_FAULT_SCHEDULE"


def claim_scheduled_faults(environ: os._Environ[str] | dict[str, str]) -> list[str]:
    """The next line of the fault schedule as argv (empty without a schedule or past its end).

    The cursor lives in ``SCHEDULE.next``, under an exclusive lock, so concurrent
    launches (several workers) each take a different line.
    """
    path = environ.get(FAULT_SCHEDULE_ENV)
    if not path:
        return []
    schedule = Path(path)
    with open(f"{schedule}.next", "a+") as cursor:
        fcntl.flock(cursor, fcntl.LOCK_EX)
        cursor.seek(0)
        taken = int(cursor.read().strip() or 0)
        cursor.seek(0)
        cursor.truncate()
        cursor.write(str(taken + 1))
    lines = schedule.read_text().splitlines()
    return shlex.split(lines[taken]) if taken < len(lines) else []
