"""SimEngine: the built-in vLLM simulator, launched as a real server process."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from autotune import __version__
from autotune.catalog.hardware import get_gpu
from autotune.config.trial_config import TrialConfig
from autotune.defaults import DEFAULT_TIME_SCALE
from autotune.engines.base import BaseEngine, PhaseCallback, Server
from autotune.engines.launcher import api_key_of, launch_process_server
from autotune.errors import InputError
from autotune.sim.server.flags import EMULATED_VLLM_VERSION
from autotune.vocabulary import HardwareFingerprint

# ``autotune-sim X (vLLM Y)``: Y is the vLLM version whose flags and logs it speaks.
SIM_ENGINE_VERSION = f"autotune-sim {__version__} (vLLM {EMULATED_VLLM_VERSION})"


class SimEngine(BaseEngine):
    """``python -m autotune.sim serve``: vLLM's flags, logs and /metrics, modelled speed."""

    name = "sim"

    def __init__(
        self,
        *,
        hardware: str,
        time_scale: float = DEFAULT_TIME_SCALE,
        seed: int = 0,
        noise: float = 0.0,
        sim_model: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if time_scale <= 0:
            raise InputError(f"time_scale must be > 0, but got time_scale={time_scale}")
        if noise < 0:
            raise InputError(f"noise must be >= 0, but got noise={noise}")
        self._gpu = get_gpu(hardware)  # raises InputError naming the known GPUs
        self._hardware_name = hardware
        self.time_scale = time_scale
        self.seed = seed
        self.noise = noise
        self.sim_model = sim_model  # catalog model simulated when configs name a path or id
        self.extra_args = tuple(extra_args)

    def version(self) -> str:
        return SIM_ENGINE_VERSION

    def hardware(self) -> HardwareFingerprint:
        return HardwareFingerprint(
            gpu_name=self._gpu.name, memory_bytes=self._gpu.memory_bytes, source="simulator"
        )

    def argv(self, config: TrialConfig, port: int) -> list[str]:
        """The exact command line for one trial on ``port``."""
        noise = ["--noise", f"{self.noise:g}"] if self.noise else []
        served = config.vllm_args()
        if self.sim_model and served[0] != self.sim_model:
            # The catalog model is simulated; it answers under the name the user gave.
            served = [self.sim_model, *served[1:]]
            if "served-model-name" not in config.flags:
                served += ["--served-model-name", config.model]
        return [
            sys.executable,
            *("-m", "autotune.sim", "serve"),
            *served,
            *("--hardware", self._hardware_name),
            *("--time-scale", f"{self.time_scale:g}"),
            *("--seed", str(self.seed)),
            *noise,
            *("--host", "127.0.0.1", "--port", str(port)),
            *self.extra_args,
        ]

    @asynccontextmanager
    async def launch(
        self,
        config: TrialConfig,
        *,
        log_path: Path,
        startup_timeout_s: float,
        on_phase: PhaseCallback | None = None,
    ) -> AsyncIterator[Server]:
        env = {**os.environ, **config.env}
        async with launch_process_server(
            lambda port: self.argv(config, port),
            env=env,
            log_path=log_path,
            startup_timeout_s=startup_timeout_s,
            on_phase=on_phase,
            time_scale=self.time_scale,
            api_key=api_key_of(config, env),
            lockstep=True,  # figures in modelled time, whatever the host's load
        ) as server:
            yield server
