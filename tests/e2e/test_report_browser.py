"""Results on a study the simulator produced, and the HTML report in headless Chromium.

A module fixture runs the real `autotune run` against the simulator (4 trials,
a short replay); export, explain, compare and report then run as the real CLI
in subprocesses, and the report must open in Chromium with no console message.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import optuna
import pytest
import yaml
from typer.testing import CliRunner

from autotune.cli import app
from autotune.trial.record import TrialRecord
from tests.e2e.conftest import tuner_args
from tests.results.conftest import build_study

REPO = Path(__file__).resolve().parents[2]
SAMPLE_WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_TIMEOUT_S = 90
RUN_TIMEOUT_S = 150
CLI_TIMEOUT_S = 60
DASHBOARD_TIMEOUT_S = 60
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get update; apt-get install -y chromium)"
)
pytestmark = pytest.mark.timeout(300)


def _run_group(argv: list[str], *, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """Run ``argv`` in its own process group; the whole group dies if it overruns."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def autotune(*args: str, cwd: Path, timeout_s: float = CLI_TIMEOUT_S) -> str:
    """The real command in a subprocess (run, report: the ones that launch or write files)."""
    result = _run_group([sys.executable, "-m", "autotune", *args], cwd=cwd, timeout_s=timeout_s)
    assert result.returncode == 0, f"autotune {shlex.join(args)}:\n{result.stderr[-3000:]}"
    return result.stdout


def autotune_in_process(*args: str) -> str:
    """The real CLI app in-process: the same commands, without a 3-7 s interpreter start each."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"autotune {shlex.join(args)}:\n{result.output[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def sim_study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A 4-trial study of the simulated RTX 4080 Super, made by the real `autotune run`."""
    workdir = tmp_path_factory.mktemp("sim-study")
    storage_url = f"sqlite:///{workdir / 'studies.db'}"
    autotune(
        "run",
        "--objective", "throughput",
        "--workload", str(SAMPLE_WORKLOAD),
        "--engine", "sim",
        "--hardware", "rtx4080s-32g",
        "--model", "qwen3.6-27b-awq",
        "--trials", "4",
        *tuner_args(workdir / "settings", {
            "load": {"max_requests": 16},
            "simulator": {"time_scale": 200},  # fast: these tests check outputs, not fidelity
            "warm_start_budget_s": 3,  # the seeds come from what was predicted by then
            "seed": 1,
        }),
        "--storage", storage_url,
        cwd=workdir,
        timeout_s=RUN_TIMEOUT_S,
    )  # fmt: skip
    name = optuna.get_all_study_names(storage_url)[0]
    trials = optuna.load_study(study_name=name, storage=storage_url).trials
    records = {t.number: TrialRecord.read(t.user_attrs) for t in trials}
    if not any(t.state.name == "COMPLETE" and records[t.number].outcome == "ok" for t in trials):
        outcomes = [f"{r.outcome}: {r.error}" for r in records.values()]
        pytest.fail(f"autotune run produced no ok trial to test on: {outcomes}")
    yield storage_url, workdir


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
    return _run_group(argv, cwd=profile.parent, timeout_s=BROWSER_TIMEOUT_S).stderr


def _console_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if ":CONSOLE" in line]


@needs_chromium
def test_console_capture_sees_a_broken_page(tmp_path: Path) -> None:
    """The check below is only worth something if it catches an error when there is one."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>missingFunction();</script></body></html>")
    log = _open_headless(page, tmp_path / "profile", "--dump-dom")
    assert any("missingFunction is not defined" in line for line in _console_lines(log))


def _best_trial(storage_url: str) -> optuna.trial.FrozenTrial:
    """The trial the tool hands over: the tuner's crown after confirmation."""
    name = optuna.get_all_study_names(storage_url)[0]
    study = optuna.load_study(study_name=name, storage=storage_url)
    return study.trials[study.user_attrs["winner"]["trial"]]


def test_export_formats_on_a_simulated_study(sim_study: tuple[str, Path]) -> None:
    storage_url, workdir = sim_study
    best = _best_trial(storage_url)
    shell = autotune_in_process("export", "--storage", storage_url)
    command = [line for line in shell.splitlines() if line.startswith("vllm serve ")]
    config = TrialRecord.read(best.user_attrs).config
    assert config is not None
    assert shlex.split(command[0]) == ["vllm", "serve", *config.vllm_args()]
    assert "# hardware: rtx4080s-32g; engine: sim" in shell
    assert "# gain over baseline: " in shell
    out = workdir / "best.yaml"
    autotune_in_process("export", "--storage", storage_url, "--format", "yaml", "--out", str(out))
    document = yaml.safe_load(out.read_text())
    assert document["model"] == "qwen3.6-27b-awq"
    flags = config.flags
    assert document["kv-cache-memory-bytes"] == flags["kv-cache-memory-bytes"]
    meta = json.loads(autotune_in_process("export", "--storage", storage_url, "--format", "json"))
    assert meta["meta"]["trial"] == best.number
    study = optuna.load_study(study_name=None, storage=storage_url)
    assert meta["meta"]["output_throughput_tok_s"] == pytest.approx(
        study.user_attrs["winner"]["mean"]  # the crown's mean, as the run summary quotes it
    )


def test_explain_and_compare_on_a_simulated_study(sim_study: tuple[str, Path]) -> None:
    storage_url, _ = sim_study
    best = _best_trial(storage_url)
    name = optuna.get_all_study_names(storage_url)[0]
    # The crown's figure: the mean of its runs when racing re-measured it.
    mean = optuna.load_study(study_name=name, storage=storage_url).user_attrs["winner"]["mean"]
    text = autotune_in_process("explain", "--storage", storage_url)
    assert f"The best config is trial {best.number}: throughput {mean:,.2f}" in text
    assert "Where out-of-memory begins" in text
    table = autotune_in_process(
        "compare", name, "--storage", storage_url, "--price", "rtx4080s=0.35"
    )
    assert f"{mean:,.1f}" in table
    assert f"{mean * 3600 / 0.35:,.0f}" in table


@needs_chromium
def test_report_of_a_simulated_study_opens_without_console_errors(
    sim_study: tuple[str, Path],
) -> None:
    storage_url, workdir = sim_study
    page = workdir / "report.html"
    autotune("report", "--storage", storage_url, "--out", str(page), cwd=workdir)
    shot = workdir / "report.png"
    log = _open_headless(
        page, workdir / "profile", "--window-size=1200,2400", f"--screenshot={shot}"
    )
    assert _console_lines(log) == []
    assert shot.stat().st_size > 50_000  # a drawn page, not a blank one
    target = os.environ.get("AUTOTUNE_REPORT_SCREENSHOT")
    if target:  # keep the picture for a person to look at
        shutil.copy(shot, target)


# Writes into the page title how many plots there are and which ones reach past the window.
CUT_OFF_PROBE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const width = document.documentElement.clientWidth;
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  const cut = plots.map((plot, i) => {
    const svg = plot.querySelector('.main-svg');
    const right = Math.max(plot.getBoundingClientRect().right,
                           svg ? svg.getBoundingClientRect().right : 0);
    return right > width + 1 ? `${i}:${Math.round(right)}` : null;
  }).filter(Boolean);
  document.title = `plots=${plots.length} cut=[${cut.join(',')}] width=${width}`;
}, 500));
</script>"""


@needs_chromium
def test_no_report_plot_is_cut_off_at_1400_px(tmp_path: Path) -> None:
    """Before: Optuna's slice plot (300 px a parameter) reached 1,643 px in a 1,385 px page."""
    storage_url = f"sqlite:///{tmp_path / 'studies.db'}"
    build_study(storage_url, "qwen-4080")  # 13 trials: importance, slice and contour plots
    page = tmp_path / "report.html"
    autotune("report", "--storage", storage_url, "--study", "qwen-4080", "--out", str(page),
             cwd=tmp_path)  # fmt: skip
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", CUT_OFF_PROBE + "</body>"))
    argv = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,2000",
        "--virtual-time-budget=5000", "--dump-dom", probed.as_uri(),
    ]  # fmt: skip
    dom = _run_group(argv, cwd=tmp_path, timeout_s=BROWSER_TIMEOUT_S).stdout
    found = re.search(r"<title>plots=(\d+) cut=\[([^\]]*)\] width=(\d+)</title>", dom)
    assert found, dom[:2000]
    assert int(found[1]) >= 6 and found[3] != "0"
    assert found[2] == "", f"plots reaching past {found[3]} px (index:right edge): {found[2]}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def dashboard(sim_study: tuple[str, Path]) -> Iterator[str]:
    """`autotune dashboard` serving the simulated study on 127.0.0.1; the group dies after."""
    storage_url, workdir = sim_study
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune",
            "dashboard",
            "--storage",
            storage_url,
            "--port",
            str(port),
        ],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def test_simulated_study_opens_in_optuna_dashboard(
    dashboard: str, sim_study: tuple[str, Path]
) -> None:
    storage_url, _ = sim_study
    deadline = time.monotonic() + DASHBOARD_TIMEOUT_S
    summaries = None
    while summaries is None and time.monotonic() < deadline:
        try:
            summaries = httpx.get(f"{dashboard}/api/studies", timeout=5).json()["study_summaries"]
        except httpx.HTTPError:
            time.sleep(0.5)
    assert summaries, f"optuna-dashboard did not answer within {DASHBOARD_TIMEOUT_S} s"
    (summary,) = summaries
    assert summary["study_name"].startswith("qwen3.6-27b-awq@rtx4080s-32g")
    study = httpx.get(f"{dashboard}/api/studies/{summary['study_id']}?after=0", timeout=30).json()
    stored = optuna.load_study(study_name=summary["study_name"], storage=storage_url)
    assert study["objective_names"] == stored.metric_names
    launched = [t for t in study["trials"] if t["artifacts"]]
    assert launched, "no trial shows its server log / request CSV as artifacts"
    assert {a["filename"] for a in launched[0]["artifacts"]} >= {"server.log", "requests.csv"}
    keys = {attr["key"] for attr in study["trials"][0]["user_attrs"]}
    assert {"outcome", "config", "argv", "replay", "is_baseline"} <= keys
