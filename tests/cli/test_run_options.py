"""`autotune run`'s face: the options a user decides, each with a help line; the tuner's
settings refused in one line when wrong; `--version`; a plain `--storage` path; hints
that name their study and storage, so that a copied one runs."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune import __version__
from autotune.cli import app
from autotune.cli._run_output import summary_lines
from autotune.engines.sim import SIM_ENGINE_VERSION
from autotune.results.explain import pareto_sentences
from autotune.results.reader import load_study
from tests.conftest import scaled_timeout_s
from tests.results.conftest import POINTS, Point, build_study

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
QWEN_SPACE = REPO / "search_spaces" / "qwen3.6-27b-awq.yaml"
MOST_OPTIONS = 23  # the options a user decides, --help included (issue 25: about 20; --seed)
FORMER_SWITCHES = (
    "--race", "--race-early", "--crown-prior", "--explore-tail", "--refine", "--overtake",
    "--recalibrate", "--reseed", "--local-search", "--dedup", "--recheck", "--prune",
    "--learn", "--confirm", "--warm-start", "--warm-start-budget", "--prescreen",
)  # fmt: skip
OPTION_ROW = re.compile(r"^│\s+(?:\*\s+)?(--[a-z-]+)(?:\s+-\w)?\s+<[^>]+>\s*(.*?)\s*│$")


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI app in-process, in ``cwd``."""
    with contextlib.chdir(cwd):
        result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def run_args(*extra: str) -> list[str]:
    return ["run", "--workload", str(WORKLOAD), "--engine", "sim", "--hardware",
            "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--trials", "1", *extra]  # fmt: skip


def test_run_help_lists_about_twenty_options_each_with_a_help_line() -> None:
    """Before: 50 options, 17 of them the tuner's switches; --seed and --max-requests bare."""
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "run", "--help"],
        capture_output=True, text=True, timeout=scaled_timeout_s(60),
        env={**os.environ, "COLUMNS": "240"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [OPTION_ROW.match(line) for line in done.stdout.splitlines()]
    options = {row[1]: row[2] for row in rows if row}
    assert "--workload" in options and "--tuner" in options and "--help" in options
    assert len(options) <= MOST_OPTIONS, sorted(options)
    bare = [name for name, text in options.items() if len(text.split()) < 3]
    assert not bare, f"options without a help line: {bare}"
    assert not [name for name in FORMER_SWITCHES if name in options]


def test_version_names_the_package_and_the_simulator() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "--version"],
        capture_output=True,
        text=True,
        timeout=scaled_timeout_s(60),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"autotune {__version__} (simulator: {SIM_ENGINE_VERSION})"
    assert SIM_ENGINE_VERSION.startswith(f"autotune-sim {__version__} (vLLM ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("confim: 0\n", "confim: unknown setting (did you mean confirm?)"),
        ("warm_start: -2\n", "warm_start: Input should be greater than or equal to 0 (got -2)"),
    ],
)
def test_a_bad_settings_file_exits_2_with_one_line_and_no_study(
    tmp_path: Path, text: str, expected: str
) -> None:
    settings = tmp_path / "tuner.yaml"
    settings.write_text(text)
    done = cli(tmp_path, *run_args("--tuner", str(settings), "--storage", "a.db"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {settings}:1: {expected}"]
    assert not (tmp_path / "a.db").exists()


def test_a_bad_key_in_the_space_s_tuner_section_exits_2_naming_the_space(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(QWEN_SPACE.read_text() + "tuner:\n  dedupe: false\n")
    done = cli(tmp_path, *run_args("--space", str(space), "--storage", "a.db"))
    assert done.returncode == 2, done.stdout + done.stderr
    line = len(QWEN_SPACE.read_text().splitlines()) + 2
    expected = f"error: {space}:{line}: tuner.dedupe: unknown setting (did you mean dedup?)"
    assert done.stderr.strip().splitlines() == [expected]


def test_a_plain_storage_path_is_a_sqlite_file(tmp_path: Path) -> None:
    """Before: `--storage night.db` was 'not a database URL'."""
    (tmp_path / "studies").mkdir()
    build_study(f"sqlite:///{tmp_path / 'studies' / 'night.db'}", "night")
    for storage in ("studies/night.db", str(tmp_path / "studies" / "night.db")):
        listed = cli(tmp_path, "studies", "--storage", storage)
        assert listed.returncode == 0, listed.stderr
        assert "night" in listed.stdout
    shown = cli(tmp_path, "show", "--storage", "studies/night.db", "--study", "night")
    assert shown.returncode == 0 and "(baseline)" in shown.stdout, shown.stderr


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ("mongodb://db/x", "unknown database scheme 'mongodb'"),
        ("mysql://u@db/x", "the mysql driver is not installed"),
    ],
)
def test_an_unknown_storage_scheme_is_one_line(tmp_path: Path, storage: str, expected: str) -> None:
    for command in (["studies"], ["show"], run_args()):
        done = cli(tmp_path, *command, "--storage", storage)
        assert done.returncode == 2, done.stdout + done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"error: --storage {storage}: {expected}"), line


def _copied(line: str) -> list[str]:
    """The ``autotune ...`` command a printed hint names, as a user copies it."""
    text = line[line.index("autotune ") :]
    return shlex.split(text.rstrip(").").removesuffix(" (or pick by a limit with --slo"))[1:]


def test_the_no_feasible_hint_names_its_storage_and_study_and_runs(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'other.db'}"
    build_study(storage, "dry", points=[p for p in POINTS if p.kv_gib > 13])  # every one OOMs
    (line,) = summary_lines(load_study(storage, "dry"))
    assert "No feasible configuration yet" in line
    argv = _copied(line)
    assert argv == ["show", "--storage", storage, "--study", "dry"]
    done = cli(Path.cwd(), *argv)
    assert done.returncode == 0 and "dry" in done.stdout, done.stderr


def test_the_export_hint_names_its_storage_and_study_and_runs(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'other.db'}"
    build_study(storage, "first")
    build_study(storage, "second")  # the most recent: a hint without --study exports it
    line = next(x for x in summary_lines(load_study(storage, "first")) if "export it:" in x)
    argv = _copied(line)
    assert argv == ["export", "--storage", storage, "--study", "first"]
    done = cli(tmp_path, *argv)
    assert done.returncode == 0, done.stderr
    assert "study 'first'" in done.stdout


def test_the_pareto_hint_exports_another_front_trial_and_runs(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'mo.db'}"
    study = build_study(storage, "mo", multi_objective=True, points=[Point(6.0, "auto", 16, 0)])
    (best,) = study.trials
    slower = optuna.trial.create_trial(
        values=[best.values[0] / 2, best.values[1] / 2],  # half the throughput and latency
        params=best.params, distributions=best.distributions,
        user_attrs=best.user_attrs, system_attrs=best.system_attrs,
    )  # fmt: skip
    study.add_trial(slower)
    sentence = pareto_sentences(load_study(storage, "mo"))[0]
    argv = _copied(sentence)
    assert argv == ["export", "--storage", storage, "--study", "mo", "--trial", "1"]
    done = cli(tmp_path, *argv)
    assert done.returncode == 0, done.stderr
    assert "trial 1" in done.stdout
