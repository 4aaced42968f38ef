"""The study's storage misbehaves: locked by another process, read-only, full.

Each time: one clear line and exit 2, never a traceback; what was stored before
is intact and a rerun resumes once the cause is gone.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.results.reader import load_study
from autotune.trial.record import TrialRecord
from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD, autotune_argv, processes_in, tuner_args

FITS_SPACE = REPO / "tests" / "e2e" / "data" / "fits.yaml"


def run_argv(db: Path, trials: int, cwd: Path, *, time_scale: float = 50) -> list[str]:
    args = [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(FITS_SPACE),
        "--storage", f"sqlite:///{db}", "--study", "s",
        "--sampler", "random", "--trials", str(trials),
        *tuner_args(cwd / "settings", {
            "dedup": False, "warm_start": 0, "confirm": 0,
            "simulator": {"time_scale": time_scale}, "load": {"max_requests": 8},
        }),
    ]  # fmt: skip
    return autotune_argv(*args)


def run(db: Path, trials: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_argv(db, trials, cwd),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """Make ``directory`` read-only: chmod, or (root ignores modes) a read-only remount."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        yield
        directory.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "--bind", str(directory), str(directory)], check=False)
    if mounted.returncode != 0:
        pytest.skip("running as root without mount: no way to make a directory read-only")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True)
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=False)  # the test holds the db


@pytest.mark.timeout(200)
def test_a_read_only_studies_directory_is_one_line_and_the_study_is_untouched(
    tmp_path: Path,
) -> None:
    studies = tmp_path / "studies"
    studies.mkdir()
    assert run(studies / "a.db", 1, tmp_path).returncode == 0
    before = (studies / "a.db").read_bytes()
    with read_only(studies):
        line = one_error_line(run(studies / "a.db", 2, tmp_path))
        assert str(studies) in line and "Read-only" in line, line
    assert (studies / "a.db").read_bytes() == before
    assert processes_in(tmp_path) == []
    assert run(studies / "a.db", 2, tmp_path).returncode == 0  # resumes once writable
    assert len(load_study(f"sqlite:///{studies / 'a.db'}", "s").trials) == 2


@pytest.mark.faults
@pytest.mark.timeout(120)
def test_a_study_locked_by_another_process_is_one_line_and_resumes_after(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    assert run(db, 1, tmp_path).returncode == 0
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing, and never letting go
    try:
        line = one_error_line(run(db, 2, tmp_path))
        assert "locked" in line
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert processes_in(tmp_path) == []
    assert run(db, 2, tmp_path).returncode == 0
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2


@contextlib.contextmanager
def small_filesystem(directory: Path, size: str) -> Iterator[None]:
    """A tmpfs of ``size`` at ``directory``: a disk that fills up (needs root and mount)."""
    directory.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full disk is simulated with a small tmpfs, which needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", directory])
    if mounted.returncode != 0:
        pytest.skip("mount is not permitted here: no small filesystem to fill")
    try:
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=False)  # the test holds the db


@pytest.mark.faults
@pytest.mark.timeout(300)
def test_a_full_disk_mid_study_is_one_line_and_the_stored_trials_survive(tmp_path: Path) -> None:
    """The disk holds ~2 trials: the run stops with one line, a rerun with room resumes.
    The trial whose record the disk cut short reads as the storage failure it was (it
    read `ok: no measurement`, a FAIL trial with outcome ok)."""
    disk = tmp_path / "disk"
    db = disk / "a.db"
    with small_filesystem(disk, "200k"):
        done = run(db, 8, tmp_path)
        line = one_error_line(done)
        assert "writing the study failed" in line and "rerun" in line, line
        assert processes_in(tmp_path) == []
        study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
        stored = study.get_trials(states=(TrialState.COMPLETE,))
        assert stored and all(TrialRecord.read(t.user_attrs).outcome for t in stored)
        cut_short = study.get_trials(states=(TrialState.FAIL,))
        assert cut_short, [t.state for t in study.trials]
        outcomes = [TrialRecord.read(t.user_attrs).outcome for t in cut_short]
        assert outcomes == ["storage-error"] * len(cut_short), outcomes
        ended = [
            text for text in done.stdout.splitlines() if f"trial {cut_short[0].number} [" in text
        ]
        assert "storage-error" in ended[-1] and " ok" not in ended[-1], ended
        rows = load_study(f"sqlite:///{db}", "s").trials
        assert [row.outcome_text for row in rows if row.state == "FAIL"] == outcomes
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        assert run(db, len(stored) + 1, tmp_path).returncode == 0  # room again: it resumes
        loaded = load_study(f"sqlite:///{db}", "s")
        assert sum(row.state == "COMPLETE" for row in loaded.trials) == len(stored) + 1


def fill(directory: Path) -> None:
    """Write a file into ``directory`` until its filesystem has no byte left."""
    with (directory / "filler").open("wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:  # until ENOSPC
            out.write(b"\0" * 65536)


@pytest.mark.faults
@pytest.mark.timeout(400)
def test_a_disk_that_fills_during_a_replay_is_one_line_and_the_rerun_resumes(
    tmp_path: Path,
) -> None:
    """The disk fills while trial 1 replays: its heartbeats (every second) and its record
    can no longer be written. One line and exit 2, not a traceback per heartbeat and
    Optuna's "Should not reach"; the trial shows as the storage failure it was, and a
    rerun with room again recovers it and finishes the budget."""
    disk = tmp_path / "disk"
    db = disk / "a.db"
    with small_filesystem(disk, "4m"):
        argv = [*run_argv(db, 3, tmp_path, time_scale=5), "--heartbeat-interval", "1"]
        stderr = tmp_path / "stderr.txt"
        with stderr.open("w") as err:
            process = subprocess.Popen(
                argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=err, text=True
            )
            assert process.stdout is not None
            out = []
            for text in process.stdout:
                out.append(text)
                if "trial 1: replaying" in text:
                    fill(disk)
                    break
            out.extend(process.stdout)
            process.wait(timeout=240)
        done = subprocess.CompletedProcess(
            argv, process.returncode, "".join(out), stderr.read_text()
        )
        line = one_error_line(done)
        assert f"--storage sqlite:///{db}" in line and "disk is full" in line, line
        assert "rerun" in line, line
        ended = [text for text in out if "trial 1 [" in text]
        assert ended and "storage-error" in ended[-1], out
        assert processes_in(tmp_path) == []
        study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
        assert [t.state for t in study.trials][:1] == [TrialState.COMPLETE]
        assert study.trials[1].state != TrialState.COMPLETE
        (disk / "filler").unlink()
        assert run(db, 3, tmp_path).returncode == 0  # room again: it resumes
        study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
        assert study.trials[1].state == TrialState.FAIL
        assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 3
