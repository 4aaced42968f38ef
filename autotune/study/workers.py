"""Several workers in one study: GPU groups, worker processes, the hardware check.

``autotune run --gpus 0,1,2,3`` starts one ``autotune worker`` process per GPU
group (``CUDA_VISIBLE_DEVICES`` set to the group), all in one study on a
PostgreSQL storage. Optuna's RDB storage hands each WAITING trial to exactly one
worker, and its heartbeat lets a surviving worker retry a dead worker's trial.
There is no scheduler of ours beyond starting the processes and waiting.

Processes, not threads: a worker that dies (``kill -9``, the OOM killer) takes
only its own trial with it, and its server dies with it (the launcher's
watchdog); each process keeps the single run's signal handling and event loop;
and the very same command joins the study from other hosts.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from sqlalchemy.engine import make_url

from autotune.engines.process import child_preexec, interrupt_after_forks
from autotune.errors import InputError
from autotune.vocabulary import HardwareFingerprint

FINGERPRINT_KEYS = ("gpu_name", "memory_bytes", "count")  # what must match to compare trials
STOP_GRACE_S = 60.0  # a worker's own interrupt handling: record the trial, stop its server


def gpu_groups(gpus: str | None, per_trial: int) -> list[str]:
    """``"0,1,2,3"`` and 2 -> ``["0,1", "2,3"]``; None -> no groups (one worker, as before)."""
    if gpus is None:
        return []
    parts = [part.strip() for part in gpus.split(",")]
    if not parts or not all(part.isdigit() for part in parts):
        raise InputError(f"--gpus {gpus!r}: expected GPU indices such as 0,1,2,3")
    if len(set(parts)) != len(parts):
        raise InputError(f"--gpus {gpus!r}: a GPU is named twice")
    if per_trial < 1 or len(parts) % per_trial:
        raise InputError(
            f"--gpus-per-trial {per_trial}: {len(parts)} GPUs do not split into groups of it"
        )
    return [",".join(parts[start : start + per_trial]) for start in range(0, len(parts), per_trial)]


def refuse_sqlite(storage_url: str, why: str) -> None:
    """Several writers need a server database: one line pointing to PostgreSQL."""
    if make_url(storage_url).get_backend_name() == "sqlite":
        raise InputError(
            f"{why} writes one study from several processes, and SQLite takes one writer "
            "at a time: use --storage postgresql://USER@HOST/DB (README: several GPUs and hosts)"
        )


def check_hardware(study_hardware: dict | None, ours: HardwareFingerprint, *, allow: bool) -> None:
    """Refuse to join a study measured on other hardware, unless the user allows it."""
    if study_hardware is None or allow:
        return
    mine = ours.model_dump(mode="json")
    differ = [key for key in FINGERPRINT_KEYS if study_hardware.get(key) != mine.get(key)]
    if differ:
        theirs = ", ".join(f"{key}={study_hardware.get(key)!r}" for key in differ)
        here = ", ".join(f"{key}={mine.get(key)!r}" for key in differ)
        raise InputError(
            f"this worker's hardware ({here}) differs from the study's ({theirs}): its "
            "measurements would not compare; pass --allow-other-hardware to join anyway"
        )


def worker_seed(seed: int | None, worker: str) -> int | None:
    """This worker's own sampler seed, drawn from ``--seed`` and the worker's name
    (``host:pid gpus G``). Each worker builds its own sampler: with the study's seed they
    all drew the same stream and proposed the same configs in lockstep."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed} {worker}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def worker_argv(storage_url: str, study: str, group: str) -> list[str]:
    """The command one local worker runs (the same as on another host, plus its group)."""
    return [
        sys.executable,
        *("-m", "autotune", "worker"),
        *("--storage", storage_url, "--study", study, "--gpus", group, "--no-summary"),
    ]


def run_workers(
    storage_url: str, study: str, groups: list[str], *, say: Callable[[str], None]
) -> dict[str, int]:
    """Start one worker per GPU group, relay their lines (prefixed), wait for all.

    Returns each group's exit code. On KeyboardInterrupt (Ctrl-C, SIGTERM) every
    worker is interrupted as a single run would be, then the interrupt goes on.
    """
    workers: dict[str, subprocess.Popen[str]] = {}
    relays = []
    try:
        with interrupt_after_forks():  # an interrupt while forking: raised once all started
            for group in groups:
                process = subprocess.Popen(
                    worker_argv(storage_url, study, group),
                    env={**os.environ, "CUDA_VISIBLE_DEVICES": group},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    preexec_fn=child_preexec(),
                )
                workers[group] = process
                relay = threading.Thread(target=_relay, args=(process, f"[gpus {group}] ", say))
                relay.start()
                relays.append(relay)
        codes = {group: process.wait() for group, process in workers.items()}
    except KeyboardInterrupt:
        _interrupt(list(workers.values()))
        raise
    finally:
        for relay in relays:
            relay.join(timeout=5)
    return codes


def _relay(process: subprocess.Popen[str], prefix: str, say: Callable[[str], None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        say(prefix + line.rstrip("\n"))


def _interrupt(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    for process in processes:
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
