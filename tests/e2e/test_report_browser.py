"""The HTML report opens in headless Chromium with no console errors and no network."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from autotune.report import render_report
from autotune.study_reader import load_study
from tests.results.conftest import build_study

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_TIMEOUT_S = 90

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)"
    ),
    pytest.mark.timeout(240),
]


def _open_headless(page: Path, profile: Path, *extra: str) -> str:
    """Load ``page`` in a fresh headless Chromium; return its stderr log (console included)."""
    argv = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",  # let plotly finish drawing before the dump
        *extra,
        page.as_uri(),
    ]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=BROWSER_TIMEOUT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return stderr


def _console_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if ":CONSOLE" in line]


def test_console_capture_sees_a_broken_page(tmp_path: Path) -> None:
    """The check below is only worth something if it catches an error when there is one."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>missingFunction();</script></body></html>")
    log = _open_headless(page, tmp_path / "profile", "--dump-dom")
    assert any("missingFunction is not defined" in line for line in _console_lines(log))


def test_report_opens_without_console_errors(tmp_path: Path) -> None:
    storage_url = f"sqlite:///{tmp_path / 'studies.db'}"
    build_study(storage_url, "mo", multi_objective=True)
    page = tmp_path / "report.html"
    page.write_text(render_report(load_study(storage_url)))
    shot = tmp_path / "report.png"
    log = _open_headless(
        page, tmp_path / "profile", "--window-size=1200,2400", f"--screenshot={shot}"
    )
    assert _console_lines(log) == []
    assert shot.stat().st_size > 50_000  # a drawn page, not a blank one
    target = os.environ.get("AUTOTUNE_REPORT_SCREENSHOT")
    if target:  # keep the picture for a person to look at
        shutil.copy(shot, target)
