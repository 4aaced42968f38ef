"""The one engine interface: launch a server for a TrialConfig, report, stop.

Real vLLM (``VllmEngine``) and the simulator (``SimEngine``) both implement
``BaseEngine``; the trial runner cannot tell them apart.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from autotune.config.trial_config import TrialConfig
from autotune.vocabulary import Failure, HardwareFingerprint, StartupReport


class Server(ABC):
    """A running server, handed out by ``BaseEngine.launch``."""

    url: str  # base URL, e.g. http://127.0.0.1:8123
    report: StartupReport
    log_path: Path
    served_model_name: str
    time_scale: float  # >1 when the server runs faster than modelled time (simulator)
    api_key: str | None
    lockstep: bool = False  # the simulator: a replay may hold its clock (sim/server/lockstep.py)

    @abstractmethod
    def poll_failure(self) -> Failure | None:
        """A failure seen so far while serving (process gone, fatal log line), else None.

        Non-blocking; safe to call at any time, including after the replay.
        """


PhaseCallback = Callable[[str], None]


class BaseEngine(ABC):
    """Launches servers. Knows nothing of workloads or studies."""

    name: str  # "sim" | "vllm"

    @abstractmethod
    def version(self) -> str:
        """The engine version string (stored with every trial)."""

    @abstractmethod
    def hardware(self) -> HardwareFingerprint:
        """The hardware this engine runs on."""

    @abstractmethod
    def launch(
        self,
        config: TrialConfig,
        *,
        log_path: Path,
        startup_timeout_s: float,
        on_phase: PhaseCallback | None = None,
    ) -> AbstractAsyncContextManager[Server]:
        """Start a server; the context manager stops it (and its process group) on exit.

        Raises ``ServerStartFailed`` (carrying a ``Failure``) when it does not come up.
        """
