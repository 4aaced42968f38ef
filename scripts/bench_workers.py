"""Trials per hour with 1, 2 and 4 workers on the simulator, and the storage's cost per trial.

Part 1 runs the real ``autotune run`` (simulator processes, real replays) with
``--gpus`` naming 1, 2 and 4 simulated GPUs, all on one PostgreSQL study, plus the
single-process run on SQLite as the baseline. Every trial launches (random
sampler, no dedup, no warm start, no confirmation), so the figure is launches per
hour; it is taken from the trials' own timestamps (first start to last end), so
the run's one-off setup (pre-flight, predictions) is left out. On a machine with
fewer cores than workers the simulated servers and replays share the cores, so
the ratio measures this machine as much as autotune.

Part 2 times what the storage costs one trial, in process, without a server: the
calls a trial makes (ask, the worker attr, the tuner's two reads of the study,
every user attr of a real stored trial, its constraints, tell), on SQLite and on
PostgreSQL, alone and with 4 processes writing at once.

A scratch PostgreSQL server is started for the run (tests/e2e/postgres.py).

    python scripts/bench_workers.py [--trials 12] [--storage-trials 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.study import storage_url  # noqa: E402
from tests.e2e.postgres import create_database, postgres_server  # noqa: E402

WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
SPACE = REPO / "tests" / "e2e" / "data" / "oom-boundary.yaml"
RUN = [
    "--workload", str(WORKLOAD), "--engine", "sim", "--hardware", "rtx4080s-32g",
    "--model", "qwen3.6-27b-awq", "--space", str(SPACE), "--study", "bench",
    "--sampler", "random", "--concurrency", "4",
]  # fmt: skip
SETTINGS = {  # the tuner's choices off: every trial a random launch
    "dedup": False, "warm_start": 0, "confirm": 0, "seed": 1,
    "simulator": {"time_scale": 50}, "load": {"max_requests": 12},
}  # fmt: skip
GPUS = {1: "0", 2: "0,1", 4: "0,1,2,3"}


def search_rate(storage: str, trials: int, gpus: str | None, cwd: Path) -> dict[str, Any]:
    """One `autotune run`: trials per hour from its trials' timestamps."""
    (cwd / "tuner.yaml").write_text(yaml.safe_dump(SETTINGS))
    argv = [sys.executable, "-m", "autotune", "run", *RUN, "--tuner", str(cwd / "tuner.yaml")]
    argv += ["--storage", storage]
    argv += ["--trials", str(trials)] + (["--gpus", gpus] if gpus else [])
    started = time.monotonic()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True)
    wall = time.monotonic() - started
    study = optuna.load_study(study_name="bench", storage=storage_url(storage))
    done = study.get_trials(states=(TrialState.COMPLETE,))
    span = (
        max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)
    ).total_seconds()
    return {
        "trials": len(done),
        "search_s": round(span, 1),
        "wall_s": round(wall, 1),
        "trials_per_hour": round(3600 * len(done) / span),
        "mean_trial_s": round(statistics.fmean(t.duration.total_seconds() for t in done), 2),
    }


def storage_trials(storage: str, n: int, attrs: dict[str, Any], study_name: str) -> list[float]:
    """Seconds of storage calls per trial, for ``n`` trials shaped like a real one."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rdb = optuna.storages.RDBStorage(storage_url(storage))
    study = optuna.create_study(study_name=study_name, storage=rdb, load_if_exists=True)
    times = []
    for _ in range(n):
        started = time.perf_counter()
        trial = study.ask()
        trial.set_user_attr("worker", "bench")
        for _ in range(2):  # the tuner's sync: before sampling and before launching
            study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        trial.suggest_float("kv_cache_memory_gib", 8.0, 14.0, step=2.0)
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        for key in ("oom", "crash", "error_rate"):
            trial.set_constraint(key, -1.0)
        study.tell(trial, 50.0)
        times.append(time.perf_counter() - started)
    return times


def overhead(storage: str, n: int, attrs: dict[str, Any], writers: int) -> float:
    """Median ms of storage per trial with ``writers`` processes writing one study at once."""
    optuna.create_study(study_name="overhead", storage=storage_url(storage), load_if_exists=True)
    if writers == 1:
        return 1000 * statistics.median(storage_trials(storage, n, attrs, "overhead"))
    with ProcessPoolExecutor(writers) as pool:
        jobs = [pool.submit(storage_trials, storage, n, attrs, "overhead") for _ in range(writers)]
        return 1000 * statistics.median(t for job in jobs for t in job.result())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--storage-trials", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"search": {}, "storage_ms": {}}
    with postgres_server() as server, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sqlite = f"sqlite:///{root / 'single.db'}"
        results["search"]["1 (sqlite, no --gpus)"] = search_rate(sqlite, args.trials, None, root)
        for workers, gpus in GPUS.items():
            url = create_database(server)
            results["search"][f"{workers} (postgres)"] = search_rate(url, args.trials, gpus, root)
        stored = optuna.load_study(study_name="bench", storage=storage_url(sqlite))
        attrs = stored.get_trials(states=(TrialState.COMPLETE,))[-1].user_attrs
        results["attrs_bytes"] = len(json.dumps(attrs))
        results["storage_ms"]["sqlite, 1 writer"] = overhead(
            f"sqlite:///{root / 'overhead.db'}", args.storage_trials, attrs, 1
        )
        for writers in (1, 4):
            results["storage_ms"][f"postgres, {writers} writers"] = overhead(
                create_database(server), args.storage_trials, attrs, writers
            )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print_tables(results)


def print_tables(results: dict[str, Any]) -> None:
    base = results["search"]["1 (sqlite, no --gpus)"]["trials_per_hour"]
    print("| workers | trials | search s | trials/hour | x one worker | mean trial s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, row in results["search"].items():
        ratio = row["trials_per_hour"] / base
        print(
            f"| {name} | {row['trials']} | {row['search_s']} | {row['trials_per_hour']} "
            f"| {ratio:.2f} | {row['mean_trial_s']} |"
        )
    mean_trial = results["search"]["1 (sqlite, no --gpus)"]["mean_trial_s"]
    print(f"\nstorage per trial ({results['attrs_bytes']} bytes of trial attrs):\n")
    print("| storage | ms per trial | x SQLite | share of a simulated trial |")
    print("| --- | --- | --- | --- |")
    sqlite = results["storage_ms"]["sqlite, 1 writer"]
    for name, ms in results["storage_ms"].items():
        share = ms / (1000 * mean_trial)
        print(f"| {name} | {ms:.0f} | {ms / sqlite:.2f} | {100 * share:.1f}% |")


if __name__ == "__main__":
    main()
