"""GPU groups, SQLite refused for several writers, the hardware check (study/workers.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from autotune.engines.hardware import visible_gpu_indices
from autotune.errors import InputError
from autotune.study.workers import check_hardware, gpu_groups
from autotune.vocabulary import HardwareFingerprint
from tests.e2e.conftest import SAMPLE_WORKLOAD, autotune_argv


def test_gpus_split_into_groups_of_gpus_per_trial() -> None:
    assert gpu_groups("0,1,2,3", 1) == ["0", "1", "2", "3"]
    assert gpu_groups("0,1,2,3", 2) == ["0,1", "2,3"]
    assert gpu_groups(None, 1) == []
    for bad, per in (("0,1,2", 2), ("0,0", 1), ("a,b", 1), ("0,1", 0)):
        with pytest.raises(InputError):
            gpu_groups(bad, per)


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpu_indices() == [2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e3b1c")  # UUIDs: every GPU counts
    assert visible_gpu_indices() is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpu_indices() is None


def test_a_fingerprint_that_differs_is_refused_unless_allowed() -> None:
    ours = HardwareFingerprint(gpu_name="NVIDIA H200", memory_bytes=141 * 2**30, count=1)
    same = ours.model_dump(mode="json") | {"driver": "other"}
    check_hardware(same, ours, allow=False)  # the driver alone does not matter
    other = same | {"gpu_name": "NVIDIA A100"}
    with pytest.raises(InputError, match="--allow-other-hardware"):
        check_hardware(other, ours, allow=False)
    check_hardware(other, ours, allow=True)


@pytest.mark.parametrize(
    "command",
    [
        [
            "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
            "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--gpus", "0,1",
        ],
        ["worker", "--study", "s"],
    ],
)  # fmt: skip
def test_several_writers_on_sqlite_are_refused_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    db = tmp_path / "studies" / "autotune.db"
    result = subprocess.run(
        autotune_argv(*command, "--storage", f"sqlite:///{db}"),
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "postgresql://" in lines[0] and "SQLite" in lines[0], lines
    assert not db.exists()
