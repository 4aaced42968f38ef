"""Defaults more than one layer needs (CLI, run setup, study, engines): one home each.

The CLI shows them in ``--help``; ``RunOptions``, ``StudySpec`` and the
engines fall back to the same values when called from Python.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url

DEFAULT_STORAGE_URL = "sqlite:///studies/autotune.db"
DEFAULT_ARTIFACTS_DIR = Path("studies/artifacts")  # when the storage is not a SQLite file
DEFAULT_RUNS_DIR = Path("studies/runs")  # server logs of trials, before upload as artifacts
DEFAULT_TRIALS = 20  # COMPLETE trials a study runs to
DEFAULT_SAMPLER = "guided"
DEFAULT_PRUNE = False  # opt in: it saved 0-7% in bench_tuner (measurements/history.md: pruning)
DEFAULT_STARTUP_TIMEOUT_S = 900.0  # a 27B model's first start (load + graph capture) on one GPU
DEFAULT_TIME_SCALE = 20.0  # the simulator's speed-up over modelled time in a study
DEFAULT_HEARTBEAT_S = 10  # Optuna heartbeat; a trial silent 3x this long is stale


def default_artifact_dir(storage_url: str) -> Path:
    """Where ``autotune run`` puts artifacts: beside a SQLite file, else studies/artifacts."""
    url = make_url(storage_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return Path(url.database).parent / "artifacts"
    return DEFAULT_ARTIFACTS_DIR
