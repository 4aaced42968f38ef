"""A trial stopped at its time limit stores why: the limit, what the server was doing, and
its log's tail (it stored ``failure: null``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.results.reader import load_study
from tests.e2e.conftest import processes_in
from tests.e2e.test_fault_suite import run_with_faults


@pytest.mark.timeout(180)
def test_a_timed_out_trial_stores_the_limit_and_what_the_server_was_doing(
    tmp_path: Path,
) -> None:
    process = run_with_faults(tmp_path, ["--fault-never-stream"], "--trial-timeout", "8s")
    text = (tmp_path / "autotune.out").read_text()
    assert process.returncode == 0, text
    (timed_out,) = load_study(f"sqlite:///{tmp_path / 'autotune.db'}", "faults").trials
    assert (timed_out.state, timed_out.outcome) == ("COMPLETE", "trial-timeout"), text
    failure = timed_out.failure
    assert failure is not None, timed_out
    limit = "stopped at the trial time limit of 8 s (--trial-timeout), while "
    assert failure.message.startswith(limit), failure.message
    assert failure.seconds is not None and failure.seconds >= 8
    assert failure.log_excerpt  # the server's last lines
    assert processes_in(tmp_path) == []
