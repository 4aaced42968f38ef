"""The tuner's settings in a real study on the simulator: a space's `tuner:` section changes
what the tuner does, the study stores the settings, a resume with others is refused in
one line and one with the same goes on; a plain `--storage` path and its copied hint."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import optuna
import pytest

from autotune.trial.record import TrialRecord
from tests.conftest import scaled_timeout_s
from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD, autotune_argv, autotune_in_process

SMALL = REPO / "tests" / "e2e" / "data" / "tuner-small.yaml"
SECTION = """
tuner:
  confirm: 0
  warm_start: 2
  seed: 1
  simulator:
    time_scale: 200
  load:
    max_requests: 10
"""


def run(cwd: Path, space: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = autotune_argv(
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(space),
        "--storage", "night.db", "--study", "t", "--concurrency", "4", *extra,
    )  # fmt: skip
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(600)
def test_a_space_s_tuner_section_steers_the_study_and_a_resume_keeps_it(tmp_path: Path) -> None:
    """Before: `tuner:` was an unknown space field, `--storage night.db` not a URL."""
    space = tmp_path / "small.yaml"
    space.write_text(SMALL.read_text() + SECTION)
    first = run(tmp_path, space, "--trials", "4")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    said = " ".join(first.stdout.split())
    assert "settings: warm_start=2, confirm=0, seed=1, load.max_requests=10, " in said
    assert f"simulator.time_scale=200 ({space} tuner:)" in said
    storage = f"sqlite:///{tmp_path / 'night.db'}"
    study = optuna.load_study(study_name="t", storage=storage)
    records = [TrialRecord.read(t.user_attrs) for t in study.trials]
    assert len(records) == 4
    # With the default (confirm 24) the last of 4 trials re-measures; confirm: 0, none.
    assert [r.warm_start for r in records[1:3]] == [1, 2]
    assert all(r.confirms is None for r in records)
    assert study.user_attrs["tuner"]["confirm"] == 0
    assert study.user_attrs["run_options"]["tuner"]["warm_start"] == 2  # what workers join with
    assert study.user_attrs["run_options"]["time_scale"] == 200

    # Resuming with other settings: refused in one line, the study untouched.
    other = tmp_path / "other.yaml"
    other.write_text("confirm: 3\n")
    refused = autotune_in_process(*run_args_in_process(tmp_path, space, "--tuner", str(other)))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "study 't' was run with other tuner settings (confirm 0, now 3)" in line
    assert len(optuna.load_study(study_name="t", storage=storage).trials) == 4

    # The same command with a larger budget resumes with the stored settings.
    again = run(tmp_path, space, "--trials", "5")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    trials = optuna.load_study(study_name="t", storage=storage).trials
    assert len(trials) == 5
    assert all(TrialRecord.read(t.user_attrs).confirms is None for t in trials)

    # The hint the run ended with names the storage and the study: copied, it runs.
    (hint,) = [x for x in again.stdout.splitlines() if "export it:" in x]
    argv = shlex.split(hint.split("export it: ", 1)[1])
    assert argv[:5] == ["autotune", "export", "--storage", "sqlite:///night.db", "--study"]
    copied = subprocess.run(
        autotune_argv(*argv[1:]),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=scaled_timeout_s(60),
    )
    assert copied.returncode == 0, copied.stderr
    assert copied.stdout.startswith("# autotune export: study 't'"), copied.stdout


def run_args_in_process(cwd: Path, space: Path, *extra: str) -> list[str]:
    """The same run with the storage's absolute path (the in-process CLI keeps the cwd)."""
    return [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(space),
        "--storage", str(cwd / "night.db"), "--study", "t", "--concurrency", "4",
        "--trials", "5", *extra,
    ]  # fmt: skip
