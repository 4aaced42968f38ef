"""Soak: many simulated trials back to back, a share of them faulted; is anything lost or leaking?

    python scripts/soak.py [--trials 200 | --quick] [--workers 3] [--fault-rate 0.1] [--json]

One real `autotune run` on the simulator, every trial a real server process; with
``--workers N`` it is one study on a scratch PostgreSQL server the script starts
(tests/e2e/postgres.py), run by `autotune run --gpus 0,..,N-1`. A
fault schedule (AUTOTUNE_SIM_FAULT_SCHEDULE, docs/sim-server.md) gives ~fault-rate
of the launches a fault drawn in turn from FAULTS. While it runs, the tuner's
resident memory and open file descriptors are read from /proc after each finished
trial, for the tuner and each worker it starts. Reported: trials completed and
classified, lost (asked for or stored but not COMPLETE with an outcome; goal 0),
orphans (processes left in the run's directory; goal 0), RSS and fd growth from the
first tenth of the run to the last (goal: flat; the JSON gives the worst process).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import optuna
import yaml
from optuna.trial import TrialState

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.study import storage_url  # noqa: E402
from tests.e2e.postgres import create_database, postgres_server  # noqa: E402

WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
FAULTS = (  # one launch's flags; each leaves a different trace in the study
    "--fault-crash-after-requests 3",
    "--fault-5xx-rate 0.5",
    "--fault-cut-stream-rate 0.5",
    "--fault-malformed-sse-rate 0.5",
    "--fault-hang-at-startup",
    "--fault-gpu-memory-held 20G",
)
SPACE = """\
name: soak
model: qwen3.6-27b-awq
parameters:
  kv_cache_memory_gib: {type: float, low: 8.0, high: 10.0, step: 0.5, unit: GiB,
                        flag: kv-cache-memory-bytes}
  max_num_seqs: {type: int, low: 2, high: 8}
fixed: {language-model-only: true, enable-prefix-caching: true, max-model-len: 65536}
derived: [cudagraph_capture_sizes]
baseline: {kv_cache_memory_gib: 8.0, max_num_seqs: 4}
"""
FINISHED = re.compile(r"\[(\d+)/\d+\] (?!starts)\S+:")


def schedule(trials: int, fault_rate: float, seed: int) -> tuple[list[str], int]:
    """Schedule lines for ``trials`` trials and how many are faulted."""
    rng = random.Random(seed)
    lines: list[str] = []
    faulted = 0
    for _ in range(trials):
        if rng.random() < fault_rate:
            fault = FAULTS[faulted % len(FAULTS)]
            lines.append(fault)
            if "gpu-memory-held" in fault:
                lines.append("")  # the retry, once the memory is back
            faulted += 1
        else:
            lines.append("")
    return lines, faulted


def proc_sample(pid: int) -> tuple[float, int] | None:
    """(RSS in MB, open fds) of ``pid``, or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss_kb = re.search(r"VmRSS:\s+(\d+)", status)
    return None if rss_kb is None else (int(rss_kb[1]) / 1024, fds)  # None: a zombie


def processes_in(cwd: Path) -> list[int]:
    """Live, non-zombie processes whose working directory is ``cwd``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            here = Path(os.readlink(entry / "cwd")) == cwd
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if here and state != "Z":
            found.append(int(entry.name))
    return found


def workers_of(pid: int) -> dict[str, int]:
    """The `autotune worker` children of ``pid`` (`run --gpus`), by their GPU group."""
    found = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        for child in (c for task in tasks for c in (task / "children").read_text().split()):
            argv = Path(f"/proc/{child}/cmdline").read_text().split("\0")
            if "worker" in argv and "--gpus" in argv:
                found[argv[argv.index("--gpus") + 1]] = int(child)
    except (OSError, IndexError):
        pass
    return found


def growth(samples: dict[int, tuple[float, int]]) -> dict[str, float]:
    """RSS MB and fds: the medians of the first tenth of the samples and of the last."""
    rows = [(n, rss, fds) for n, (rss, fds) in sorted(samples.items())]
    last = rows[-1][0] if rows else 0
    tenth = max(2, last // 10)
    early = [r for r in rows if r[0] <= tenth] or rows[:1]
    late = [r for r in rows if r[0] > last - tenth] or rows[-1:]

    def median(part: list[tuple[int, float, int]], index: int) -> float:
        return statistics.median(row[index] for row in part) if part else 0.0

    return {
        "rss_mb": round(median(early, 1), 1),
        "rss_growth_mb": round(median(late, 1) - median(early, 1), 1),
        "fds": median(early, 2),
        "fd_growth": round(median(late, 2) - median(early, 2)),
    }


def soak(
    trials: int, fault_rate: float, seed: int, workdir: Path, storage: str, workers: int
) -> dict:
    lines, faulted = schedule(trials, fault_rate, seed)
    (workdir / "faults.txt").write_text("\n".join(lines) + "\n")
    (workdir / "space.yaml").write_text(SPACE)
    settings = {
        "dedup": False, "warm_start": 0, "confirm": 0, "seed": seed,
        "simulator": {"time_scale": 100}, "load": {"max_requests": 8},
        "engine": {"startup_timeout_s": 15},
    }  # fmt: skip
    (workdir / "tuner.yaml").write_text(yaml.safe_dump(settings))
    gpus = ["--gpus", ",".join(map(str, range(workers)))] if workers > 1 else []
    argv = [
        sys.executable, "-m", "autotune", "run",
        "--workload", str(WORKLOAD), "--engine", "sim", "--hardware", "rtx4080s-32g",
        "--model", "qwen3.6-27b-awq", "--space", str(workdir / "space.yaml"),
        "--storage", storage, "--study", "soak",
        "--sampler", "random", "--tuner", str(workdir / "tuner.yaml"),
        "--concurrency", "4", "--trial-timeout", "30s", "--trials", str(trials), *gpus,
    ]  # fmt: skip
    env = {**os.environ, "AUTOTUNE_SIM_FAULT_SCHEDULE": str(workdir / "faults.txt")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # Per process, per count of the trials it has finished: the last RSS and the fewest
    # fds seen (between two trials no server or client socket is open: the minimum is
    # the steady state). The tuner counts every trial; a worker those on its lines
    # ("[gpus G] "). Sampling stops at the last `workers` trials: workers stand down.
    last = trials - workers
    by_process: dict[str, dict[int, tuple[float, int]]] = {}
    worker_pids: dict[str, int] = {}
    started = time.monotonic()
    out_path = workdir / "autotune.out"
    with out_path.open("w") as out:
        process = subprocess.Popen(argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env)
        while process.poll() is None:
            time.sleep(0.25)
            lines = out_path.read_text(errors="replace").splitlines()
            finished = sum(1 for line in lines if FINISHED.search(line))
            if workers > 1:
                worker_pids = {**workers_of(process.pid), **worker_pids}
            named = [("tuner", process.pid, "")]
            named += [
                (f"worker gpus {g}", pid, f"[gpus {g}] ") for g, pid in sorted(worker_pids.items())
            ]
            for name, pid, prefix in named:
                own = sum(1 for line in lines if line.startswith(prefix) and FINISHED.search(line))
                sample = proc_sample(pid)
                if sample is not None and own > 0 and finished <= last:
                    samples = by_process.setdefault(name, {})
                    fds = min(sample[1], samples.get(own, sample)[1])
                    samples[own] = (sample[0], fds)
    wall_s = time.monotonic() - started
    time.sleep(1.0)  # let the watchdogs finish standing down
    orphans = processes_in(workdir)

    study = optuna.load_study(study_name="soak", storage=storage_url(storage))
    stored = study.get_trials()
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    classified = [t for t in complete if t.user_attrs.get("outcome")]
    outcomes: dict[str, int] = {}
    for t in classified:
        outcomes[t.user_attrs["outcome"]] = outcomes.get(t.user_attrs["outcome"], 0) + 1
    growths = {name: growth(samples) for name, samples in by_process.items()}
    return {
        "trials": trials,
        "workers": workers,
        "stored": len(stored),
        "completed": len(complete),
        "classified": len(classified),
        # A shortfall and a stored trial without an outcome both count (the budget is
        # exact over every worker: scripts/fault_table.py counts trials beyond it).
        "lost": len(stored) - len(classified) + max(0, trials - len(stored)),
        "left_running": len(study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))),
        "faulted": faulted,
        "orphans": len(orphans),
        "rss_growth_mb": max((g["rss_growth_mb"] for g in growths.values()), default=0.0),
        "fd_growth": max((g["fd_growth"] for g in growths.values()), default=0),
        "growth_by_process": growths,
        "series": {
            name: [v for _, v in sorted(samples.items())] for name, samples in by_process.items()
        },
        "outcomes": outcomes,
        "exit_code": process.returncode,
        "wall_s": round(wall_s, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="40 trials")
    parser.add_argument("--fault-rate", type=float, default=0.1)
    parser.add_argument(
        "--workers", type=int, default=1, help="N > 1: N workers on a scratch PostgreSQL"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    trials = 40 if args.quick else args.trials
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="autotune-soak-")))
        workdir = workdir.resolve()
        if args.workers > 1:
            storage = create_database(stack.enter_context(postgres_server()))
        else:
            storage = f"sqlite:///{workdir / 'soak.db'}"
        result = soak(trials, args.fault_rate, args.seed, workdir, storage, args.workers)
    if args.json:
        keys = ("trials", "lost", "orphans", "rss_growth_mb", "fd_growth")
        print(json.dumps({key: result[key] for key in keys}))
        return 0 if result["lost"] == 0 and result["orphans"] == 0 else 1
    where = f"{args.workers} workers, PostgreSQL" if args.workers > 1 else "1 worker, SQLite"
    print(f"soak ({where}): {trials} trials, {result['faulted']} faulted, {result['wall_s']:.0f} s")
    print("| | value | goal |\n| --- | --- | --- |")
    for key, goal in (
        ("stored", trials), ("completed", trials), ("classified", trials), ("lost", 0),
        ("left_running", 0), ("orphans", 0), ("rss_growth_mb", "~0"), ("fd_growth", 0),
    ):  # fmt: skip
        print(f"| {key} | {result[key]} | {goal} |")
    print(f"outcomes: {result['outcomes']}")
    for name, g in sorted(result["growth_by_process"].items()):
        series = result["series"][name]
        tenth = max(1, len(series) // 10)
        print(
            f"{name}: RSS {g['rss_mb']} MB {g['rss_growth_mb']:+.1f}, "
            f"fds {g['fds']:g} {g['fd_growth']:+d}; every {tenth} of its trials: "
            f"RSS MB {[round(rss, 1) for rss, _ in series[::tenth]]}, "
            f"fds {[fds for _, fds in series[::tenth]]}"
        )
    print(f"autotune exit code: {result['exit_code']}")
    return 0 if result["lost"] == 0 and result["orphans"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
