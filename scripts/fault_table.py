"""Faults against real `autotune run` processes on the simulator: is a trial lost or doubled,
is a process left behind, is `--trials N` met exactly?

    python scripts/fault_table.py [--runs 3] [--only NAME ...] [--code DIR] [--json]

Each row of FAULTS is data: a study (trials, workers, storage), a fault schedule for the
simulated servers (AUTOTUNE_SIM_FAULT_SCHEDULE, one line of ``--fault-*`` flags per
launch, docs/sim-server.md), at most one ``Act`` done to a process once a trial reaches
a phase (a signal to autotune, a worker or the trial's server, or a command of your own),
and how many times the same command is run again afterwards. A row with ``disk_bytes``
puts the SQLite study (and its runs) on a tmpfs that small (needs root), emptied of the
act's ``filler`` file before each rerun. Add a row to cover another fault. Each run gets
a fresh directory and a fresh study (SQLite, or a database on a scratch PostgreSQL
server the script starts, tests/e2e/postgres.py; PostgreSQL rows are
skipped, with the reason, when its binaries are missing).

Counted once the last rerun has ended (``--trials N``; counted: COMPLETE or PRUNED):

- lost: N minus the counted trials when short, plus trials left RUNNING or WAITING;
- duplicated: counted trials beyond N, plus retries of a trial that counted itself;
- orphans: live processes whose working directory is the run's (servers, watchdogs,
  workers, autotune itself), 15 s after the last process autotune started has exited;
- exact: runs ending with N counted trials and none RUNNING or WAITING;
- act missed: runs where the trial finished before the act could be done (their figures
  are left out of lost, duplicated and exact);
- first run exited: the exit codes of the first `autotune run` (-9: killed, 130:
  interrupted; 0 where the act hit a worker or a server).

``--code DIR`` runs the autotune of another checkout (a baseline: ``git worktree add
/tmp/base main``) with this script's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import optuna
from optuna.trial import FrozenTrial, TrialState

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.sim.server.faults import FAULT_SCHEDULE_ENV  # noqa: E402
from autotune.study import storage_url  # noqa: E402
from tests.e2e.conftest import default_sigint, processes_in, sim_server_pids  # noqa: E402
from tests.e2e.postgres import PostgresMissing, create_database, postgres_server  # noqa: E402

WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
SPACE = REPO / "tests" / "e2e" / "data" / "fits.yaml"
STUDY = "faults"
MARKERS = {  # a phase of a trial, as its server log shows it
    "starting": "Starting to load model",
    "serving": "Application startup complete",
}
ACT_TIMEOUT_S = 240.0
RUN_TIMEOUT_S = 400.0
SETTLE_S = 15.0  # for the watchdogs to finish a session after a kill -9
SLOW = "--fault-slow-first-token-s 300"  # a launch that serves for ~20 s: time to act on it


@dataclass(frozen=True)
class Act:
    """What is done, to whom, once trial ``at`` (a number, or "last": the oldest trial running
    once N - 1 count) reaches ``phase``. ``signal`` to ``target``, or ``command`` (argv;
    ``{server_pid}``, ``{server_port}``, ``{worker_pid}``, ``{autotune_pid}`` filled in)."""

    at: int | Literal["last"]
    phase: Literal["starting", "serving"]
    target: Literal["autotune", "worker", "server"] = "autotune"
    signal: str = "SIGKILL"
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fault:
    """One row: the study, what goes wrong, and how many times the command is run again."""

    name: str
    trials: int
    act: Act | None = None
    schedule: tuple[str, ...] = ()
    workers: int = 1  # > 1: `run --gpus 0,..` on PostgreSQL
    storage: Literal["sqlite", "postgres"] = "sqlite"
    reruns: int = 1
    options: tuple[str, ...] = ()  # more `autotune run` options
    disk_bytes: int | None = None  # the study on a tmpfs this small: a disk that fills


FAULTS = (
    Fault(
        "kill -9 of autotune in the last trial, immediate rerun",
        trials=3,
        act=Act("last", "serving"),
    ),
    Fault(
        "kill -9 of autotune while a server starts",
        trials=3,
        act=Act(1, "starting"),
        schedule=("", "--fault-hang-at-startup"),
    ),
    Fault("SIGTERM to autotune mid-trial", trials=3, act=Act(1, "serving", signal="SIGTERM")),
    Fault(
        "Ctrl-C (SIGINT) while a server starts",
        trials=3,
        act=Act(1, "starting", signal="SIGINT"),
        schedule=("", "--fault-hang-at-startup"),
    ),
    Fault("server crash mid-replay", trials=3, schedule=("", "--fault-crash-after-requests 3")),
    Fault(
        "hung server (SIGSTOP), --trial-timeout 20s",
        trials=3,
        act=Act(1, "serving", target="server", signal="SIGSTOP"),
        schedule=("", SLOW),
        options=("--trial-timeout", "20s"),
    ),
    Fault(
        "hung server (SIGSTOP), the default trial time limit",
        trials=3,
        act=Act(1, "serving", target="server", signal="SIGSTOP"),
        schedule=("", SLOW),
    ),
    Fault(
        "disk full mid-trial (heartbeat every 1 s), rerun with room",
        trials=3,
        act=Act(1, "serving", command=("sh", "-c", "cat /dev/zero > {workdir}/disk/filler")),
        options=("--heartbeat-interval", "1"),
        disk_bytes=4 << 20,
    ),
    Fault(
        "kill -9 of a worker in the last trial (3 workers)",
        trials=6,
        act=Act("last", "serving", target="worker"),
        schedule=("",) * 5 + (SLOW,),
        workers=3,
        storage="postgres",
        reruns=2,
    ),
    Fault(
        "kill -9 of run --gpus mid-study (3 workers), rerun",
        trials=6,
        act=Act(2, "serving"),
        workers=3,
        storage="postgres",
    ),
)


@dataclass
class Outcome:
    """One run of a row."""

    counted: int = 0
    lost: int = 0
    duplicated: int = 0
    orphans: int = 0
    exact: bool = False
    missed: bool = False
    wall_s: float = 0.0
    exit_codes: list[int | None] = field(default_factory=list)


# The run's tuner, load, simulator and engine details: a settings file where the code
# reads one (``--tuner``), else the options the code before the settings file took.
SETTINGS = {
    "dedup": False, "warm_start": 0, "confirm": 0, "seed": 1,
    "simulator": {"time_scale": 50}, "load": {"max_requests": 8},
    "engine": {"startup_timeout_s": 5.0},
}  # fmt: skip
OLD_OPTIONS = [
    "--no-dedup", "--warm-start", "0", "--confirm", "0", "--seed", "1", "--time-scale", "50",
    "--max-requests", "8", "--startup-timeout", "5s",
]  # fmt: skip


def run_argv(fault: Fault, storage: str, workdir: Path, code: Path | None) -> list[str]:
    gpus = ["--gpus", ",".join(map(str, range(fault.workers)))] if fault.workers > 1 else []
    if ((code or REPO) / "autotune" / "tuner" / "settings_file.py").exists():
        settings = workdir / "tuner.yaml"
        settings.write_text(json.dumps(SETTINGS))  # JSON is YAML
        details = ["--tuner", str(settings)]
    else:
        details = OLD_OPTIONS
    return [
        sys.executable, "-m", "autotune", "run",
        "--workload", str(WORKLOAD), "--engine", "sim", "--hardware", "rtx4080s-32g",
        "--model", "qwen3.6-27b-awq", "--space", str(SPACE),
        "--storage", storage, "--study", STUDY, "--sampler", "random", "--concurrency", "4",
        *details, "--trials", str(fault.trials), *gpus, *fault.options,
    ]  # fmt: skip


def one_run(fault: Fault, workdir: Path, storage: str, code: Path | None) -> Outcome:
    (workdir / "faults.txt").write_text("\n".join(fault.schedule) + "\n")
    env = {**os.environ, FAULT_SCHEDULE_ENV: str(workdir / "faults.txt"), "COLUMNS": "200"}
    if code is not None:
        env["PYTHONPATH"] = str(code)
    argv = run_argv(fault, storage, workdir, code)
    handle = optuna.storages.RDBStorage(storage_url(storage))
    outcome = Outcome()
    helpers: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    for attempt in range(1 + fault.reruns):
        (workdir / "disk" / "filler").unlink(missing_ok=True)  # room again for the rerun
        with (workdir / f"autotune-{attempt}.out").open("w") as out:
            process = subprocess.Popen(
                argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, preexec_fn=default_sigint,
            )  # fmt: skip
        try:
            if attempt == 0 and fault.act is not None:
                acted = act_when_reached(fault, process, handle, workdir, env, helpers)
                outcome.missed = not acted
            outcome.exit_codes.append(process.wait(timeout=RUN_TIMEOUT_S))
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    outcome.wall_s = round(time.monotonic() - started, 1)
    for helper in helpers:
        helper.kill()
        helper.wait()
    deadline = time.monotonic() + SETTLE_S
    while processes_in(workdir) and time.monotonic() < deadline:
        time.sleep(0.25)
    outcome.orphans = len(processes_in(workdir))
    for pid in processes_in(workdir):  # leave the machine as it was
        os.kill(pid, signal.SIGKILL)
    count(fault, optuna.load_study(study_name=STUDY, storage=handle), outcome)
    return outcome


@contextmanager
def small_disk(directory: Path, size_bytes: int | None) -> Iterator[None]:
    """``directory``, a tmpfs of ``size_bytes`` when given (root and mount needed)."""
    directory.mkdir()
    if size_bytes is None:
        yield
        return
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory)]
    subprocess.run(mount, check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=False)


def act_when_reached(
    fault: Fault,
    process: subprocess.Popen[bytes],
    handle: optuna.storages.RDBStorage,
    workdir: Path,
    env: dict[str, str],
    helpers: list[subprocess.Popen[bytes]],
) -> bool:
    """Wait for the act's trial and phase, then act; False when the moment passed unseen.
    A command's process goes to ``helpers`` (stopped once the run is over)."""
    act = fault.act
    assert act is not None
    deadline = time.monotonic() + ACT_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        trial = target_trial(act, fault.trials, handle)
        if trial is not None and reached(trial, act.phase, workdir):
            worker = int(str(trial.user_attrs["worker"]).split(" ")[0].rsplit(":", 1)[1])
            servers = sim_server_pids(worker)
            pids = {
                "autotune": process.pid,
                "worker": worker,
                "server": servers[0] if servers else None,
            }
            if act.command:
                fill = {
                    "server_pid": pids["server"],
                    "server_port": server_port(pids["server"]),
                    "worker_pid": worker,
                    "autotune_pid": process.pid,
                    "workdir": workdir,
                }
                argv = [part.format(**fill) for part in act.command]
                helpers.append(subprocess.Popen(argv, cwd=REPO, env=env))  # not an orphan
                return True
            if pids[act.target] is not None:
                os.kill(pids[act.target], getattr(signal, act.signal))
                return True
        time.sleep(0.1)
    return False


def target_trial(act: Act, n_trials: int, handle: optuna.storages.RDBStorage) -> FrozenTrial | None:
    try:
        study = optuna.load_study(study_name=STUDY, storage=handle)
    except KeyError:  # not created yet
        return None
    trials = study.get_trials(deepcopy=False)
    running = [t for t in trials if t.state == TrialState.RUNNING and "worker" in t.user_attrs]
    if act.at == "last":
        counted = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
        return running[0] if counted == n_trials - 1 and running else None
    return next((t for t in running if t.number == act.at), None)


def reached(trial: FrozenTrial, phase: str, workdir: Path) -> bool:
    """Beside a SQLite file the runs are ``runs/``, else ``studies/runs/``."""
    logs = workdir.glob(f"**/runs/{STUDY}/trial-{trial.number:04d}/server.log")
    return any(MARKERS[phase] in log.read_text(errors="replace") for log in logs)


def server_port(pid: int | None) -> str:
    if pid is None:
        return ""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index("--port") + 1] if "--port" in argv else ""


def count(fault: Fault, study: optuna.Study, outcome: Outcome) -> None:
    trials = study.get_trials(deepcopy=False)
    counted = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    left = [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    numbers = {t.number for t in counted}
    retried_twice = [
        t
        for t in counted
        if t.system_attrs.get("failed_trial", t.user_attrs.get("retry_of")) in numbers
    ]
    outcome.counted = len(counted)
    outcome.lost = max(0, fault.trials - len(counted)) + len(left)
    outcome.duplicated = max(0, len(counted) - fault.trials) + len(retried_twice)
    outcome.exact = len(counted) == fault.trials and not left


def table(rows: dict[str, list[Outcome] | str]) -> str:
    lines = [
        "| fault | runs | trials lost | trials duplicated | orphan processes "
        "| --trials met exactly | act missed | first run exited | wall s (median) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, outcomes in rows.items():
        if isinstance(outcomes, str):
            lines.append(f"| {name} | skipped: {outcomes} | | | | | | | |")
            continue
        done = [o for o in outcomes if not o.missed]
        exits = sorted({o.exit_codes[0] for o in outcomes if o.exit_codes}, key=str)
        lines.append(
            f"| {name} | {len(outcomes)} | {sum(o.lost for o in done)} "
            f"| {sum(o.duplicated for o in done)} | {sum(o.orphans for o in outcomes)} "
            f"| {sum(o.exact for o in done)}/{len(done)} | {len(outcomes) - len(done)} "
            f"| {', '.join(map(str, exits))} "
            f"| {statistics.median(o.wall_s for o in outcomes):.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each row")
    parser.add_argument("--only", nargs="*", help="rows whose name contains one of these")
    parser.add_argument("--code", type=Path, help="run the autotune of this checkout instead")
    parser.add_argument("--json", action="store_true", help="every run's figures as JSON")
    args = parser.parse_args()
    faults = [f for f in FAULTS if not args.only or any(part in f.name for part in args.only)]
    rows: dict[str, list[Outcome] | str] = {}
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="autotune-faults-")))
        server: str | None = None
        missing: str | None = None
        for fault in faults:
            if fault.storage == "postgres" and server is None and missing is None:
                try:
                    server = stack.enter_context(postgres_server())
                except PostgresMissing as exc:
                    missing = str(exc)
            if fault.storage == "postgres" and server is None:
                rows[fault.name] = str(missing)
                continue
            outcomes = []
            for index in range(args.runs):
                workdir = root / f"{len(rows)}-{index}"
                workdir.mkdir()
                storage = (
                    create_database(server)
                    if fault.storage == "postgres" and server is not None
                    else f"sqlite:///{workdir / 'disk' / 'autotune.db'}"
                )
                with small_disk(workdir / "disk", fault.disk_bytes):
                    outcomes.append(one_run(fault, workdir, storage, args.code))
                print(f"{fault.name} #{index + 1}: {outcomes[-1]}", file=sys.stderr, flush=True)
            rows[fault.name] = outcomes
    code = f" (autotune from {args.code})" if args.code else ""
    print(f"fault table{code}: {args.runs} runs per row, {shlex.join(sys.argv[1:]) or 'defaults'}")
    if args.json:
        print(
            json.dumps(
                {k: v if isinstance(v, str) else [o.__dict__ for o in v] for k, v in rows.items()},
                indent=2,
            )
        )
    print(table(rows))
    clean = all(
        isinstance(o, str) or all(r.lost == r.duplicated == r.orphans == 0 for r in o)
        for o in rows.values()
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
