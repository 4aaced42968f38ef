"""How long `autotune plan` takes, and what it answers: this checkout against a baseline
checkout (``--baseline``, e.g. a `git worktree` of an earlier commit), the same command
run by each in turn, in one run so the host's load weighs on both alike.

The default command is the README's plan (its workload made first, as the README does);
``--wide`` plans the catalog's 7 data-centre and desktop GPU kinds at TP 1, 2 and 4;
``--hogs N`` runs N busy-looping processes beside it (the answer must not change).

    python scripts/bench_plan.py [--baseline ../old-checkout] [--wide] [--hogs 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_GEN = ["claudecode", "--sessions", "48", "--requests-per-session", "10", "--seed", "1"]
README_PLAN = ["--model", "qwen3.6-27b-awq", "--sessions", "40", "--slo", "ttft_p95<=3s"]
WIDE_GPUS = ("rtx4090-24g", "rtx5090-32g", "l40s-48g", "a100-80g", "h100-80g", "h200-141g")
WIDE = [*(arg for gpu in WIDE_GPUS for arg in ("--gpu", gpu)), "--gpu", "rtx4080s-32g"]
WIDE += ["--tp", "1", "--tp", "2", "--tp", "4"]


@contextlib.contextmanager
def hogs(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU while the body runs."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def plan(checkout: Path, workload: Path, extra: list[str], out: Path) -> tuple[float, str]:
    """Seconds and the answer (the first line after the table) of one `autotune plan`."""
    argv = [sys.executable, "-m", "autotune", "plan", str(workload), *README_PLAN, *extra]
    argv += ["--out", str(out), "--storage", str(out / "studies.db")]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=checkout, capture_output=True, text=True, check=True)
    seconds = time.monotonic() - started
    answer = next(
        (line.strip() for line in done.stdout.splitlines() if " x " in line and "$" in line),
        "(no answer line)",
    )
    return seconds, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="an earlier checkout to compare with")
    parser.add_argument("--wide", action="store_true", help="7 GPU kinds x TP 1, 2, 4")
    parser.add_argument("--hogs", type=int, default=0, help="CPU hogs beside the runs")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp())
    workload = scratch / "team.jsonl"
    generate = [sys.executable, "-m", "autotune", "workload", "gen", *README_GEN, str(workload)]
    subprocess.run(generate, cwd=REPO, check=True, capture_output=True)
    extra = WIDE if args.wide else []
    rows = []
    with hogs(args.hogs):
        print(f"load average at start: {os.getloadavg()[0]:.1f} ({args.hogs} hogs)", flush=True)
        for name, checkout in (("ours", REPO), ("baseline", args.baseline)):
            if checkout is None:
                continue
            seconds, answer = plan(checkout, workload, extra, scratch / name)
            rows.append((name, seconds, answer))
            print(f"{name}: {seconds:.0f} s: {answer}", flush=True)
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print("\n| checkout | seconds | answer |\n| --- | ---: | --- |")
    for name, seconds, answer in rows:
        print(f"| {name} | {seconds:.0f} | {answer} |")
    if len(rows) == 2:
        print(f"\nbaseline / ours: {rows[1][1] / rows[0][1]:.1f}x")


if __name__ == "__main__":
    main()
