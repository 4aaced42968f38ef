"""`autotune run` on a terminal (a real pseudo-terminal, the real command, simulator
servers): the live ETA counts down through each trial from the predicted trial length,
the run ends with `show`'s table of its best trials, and `--seed` reaches the study."""

from __future__ import annotations

import itertools
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.results.reader import load_study
from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")
# The live status line (" · ETA"), not a trial's end line (", ETA"): that one counts the
# replay just measured, which may rightly raise the estimate.
STATUS = re.compile(r"(trial (\d+) \[\d+/3\]|\d+/3 trials done)[^\n\r]*? · ETA (\d+):(\d\d)")


def run_on_a_terminal(cwd: Path, *args: str, timeout_s: float) -> tuple[int, str]:
    """The command's exit code and all it drew on a pseudo-terminal, escapes removed."""
    main, sub = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        stdin=sub, stdout=sub, stderr=sub, cwd=cwd, close_fds=True,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    os.close(sub)
    drawn = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the command ended and closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    process.kill() if process.poll() is None else None
    os.close(main)
    return process.wait(timeout=30), ANSI.sub("", drawn.decode(errors="replace"))


@pytest.mark.timeout(200)
def test_the_eta_counts_down_through_a_trial_and_the_run_ends_with_the_best_trials(
    tmp_path: Path,
) -> None:
    """Before: the ETA was elapsed time over trials done, so it climbed through each
    trial and dropped at its end; a terminal got no table at the end; no --seed."""
    storage = f"sqlite:///{tmp_path / 'a.db'}"
    code, drawn = run_on_a_terminal(
        tmp_path, "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--model", "qwen3.6-27b-awq", "--hardware", "rtx4080s-32g", "--trials", "3",
        "--sampler", "random", "--seed", "7", "--storage", storage, "--study", "s",
        "--duration", "60s", timeout_s=180,
    )  # fmt: skip
    assert code == 0, drawn[-3000:]
    by_trial: dict[int, list[int]] = {}
    for match in STATUS.finditer(drawn):
        if match[2] is not None:
            by_trial.setdefault(int(match[2]), []).append(60 * int(match[3]) + int(match[4]))
    # From the second trial on (the first measures the server's start-up) the ETA only falls.
    for number in (1, 2):
        etas = by_trial[number]
        assert len(etas) >= 4, by_trial
        rises = [(a, b) for a, b in itertools.pairwise(etas) if b > a]
        assert not rises, f"trial {number}'s ETA rose: {etas}"
        assert etas[-1] < etas[0], etas
    assert by_trial[2][-1] <= 1  # the last trial counts down to nothing

    summary = drawn.index("Best: trial")
    table = drawn[drawn.rindex("trials done", 0, summary) : summary]
    assert "s (sim, rtx4080s-32g)" in table and "outcome" in table, table
    assert "(baseline)" in table and "margin: the limit that decides the trial" in table

    stored = load_study(storage, "s").study.user_attrs["run_options"]
    assert stored["tuner"]["seed"] == 7
