from __future__ import annotations

import asyncio

import pytest

from autotune.engines import hardware


def test_detect_hardware_names_the_machine():
    fingerprint = hardware.detect_hardware()
    assert fingerprint.gpu_name
    if hardware.gpu_fingerprint() is None:
        assert fingerprint.source == "cpu"
        assert fingerprint.gpu_name.startswith("CPU ")
        assert fingerprint.memory_bytes and fingerprint.memory_bytes > 2**28
        assert fingerprint.count >= 1
    else:
        assert fingerprint.source in {"nvml", "nvidia-smi"}


@pytest.mark.skipif(hardware.gpu_memory_used_bytes() is not None, reason="a GPU is present")
def test_memory_wait_is_a_no_op_without_a_gpu():
    assert hardware.gpu_memory_used_bytes() is None
    assert asyncio.run(hardware.wait_for_gpu_memory([0], timeout_s=5)) < 1


@pytest.mark.gpu
def test_gpu_memory_back_to_baseline():
    used = hardware.gpu_memory_used_bytes()
    assert used is not None and all(value > 0 for value in used)
    assert asyncio.run(hardware.wait_for_gpu_memory(used, timeout_s=5)) < 1


FAKE_SMI = """#!/bin/sh
case "$1" in
  *memory.used*) printf '1024\\n2048\\n' ;;
  *) printf 'NVIDIA H200, 143771, 570.86.15\\nNVIDIA H200, 143771, 570.86.15\\n' ;;
esac
"""


def test_nvidia_smi_fallback_without_nvml(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(hardware, "nvml", None)  # as on a box without nvidia-ml-py
    fingerprint = hardware.detect_hardware()
    assert fingerprint.gpu_name == "NVIDIA H200"
    assert fingerprint.memory_bytes == 143771 * 1024**2
    assert (fingerprint.driver, fingerprint.count, fingerprint.source) == (
        "570.86.15",
        2,
        "nvidia-smi",
    )
    assert hardware.gpu_memory_used_bytes() == [1024 * 1024**2, 2048 * 1024**2]
    waited = asyncio.run(hardware.wait_for_gpu_memory([1024 * 1024**2, 2048 * 1024**2]))
    assert waited < 1
