"""Memory of `autotune workload stats` on a workload whose one request is a single long
word (a base64 image or minified blob: no whitespace, one tokenizer piece), this tree
against an older one, as a ratio, in one run.

Each run is the real CLI in a subprocess under an address-space limit (``--limit-gib``,
so the older tree's quadratic growth stops at a MemoryError instead of the OOM killer);
its peak resident memory is the child's own ``ru_maxrss`` (``os.wait4``).

    git worktree add /tmp/input-base 96f0781
    python scripts/bench_huge_line.py --before /tmp/input-base [--sizes-mb 0.01,0.1,1,10]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEADER = {"type": "header", "format": "autotune-workload", "version": 1}


def write_word_workload(path: Path, letters: int) -> None:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    word = "".join(random.Random(7).choices(alphabet, k=letters))
    request = {
        "type": "request",
        "id": "r",
        "input": {"mode": "full", "messages": [{"role": "user", "content": word}]},
        "output": {"tokens": 8},
    }
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(request) + "\n")


def measure(tree: Path, workload: Path, limit_bytes: int) -> tuple[str, float, float]:
    """(outcome, peak RSS MiB, wall s) of `workload stats` run from ``tree``'s code."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "autotune", "workload", "stats", "--json", str(workload)],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=out,
            stderr=err,
            preexec_fn=limit,
        )
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak, not the max
        process.returncode = os.waitstatus_to_exitcode(status)
        wall_s = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read().decode(errors="replace")
    rss_mib = usage.ru_maxrss / 1024
    if process.returncode == 0:
        tokens = json.loads(stdout)["input_tokens"]["max"]
        return f"ok, {tokens:,} tokens", rss_mib, wall_s
    last = (stderr.strip().splitlines() or ["?"])[-1]
    return f"exit {process.returncode}: {last.split(':')[0][:30]}", rss_mib, wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older tree's root")
    parser.add_argument("--sizes-mb", default="0.01,0.1,1,10")
    parser.add_argument("--limit-gib", type=float, default=2.0)
    args = parser.parse_args()
    limit_bytes = int(args.limit_gib * 2**30)
    print(f"address-space limit {args.limit_gib:g} GiB; peak RSS in MiB; wall in s")
    print("| word | before: outcome | RSS | wall | ours: outcome | RSS | wall | RSS ratio |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for size_mb in (float(size) for size in args.sizes_mb.split(",")):
            workload = Path(tmp) / f"word-{size_mb:g}mb.jsonl"
            write_word_workload(workload, int(size_mb * 1e6))
            before = measure(args.before, workload, limit_bytes)
            ours = measure(REPO, workload, limit_bytes)
            bound = "" if before[0].startswith("ok") else "< "  # before stopped at the limit
            ratio = f"{bound}{ours[1] / before[1]:.2f}"
            cells = [f"{o} | {rss:,.0f} | {wall:.1f}" for o, rss, wall in (before, ours)]
            print(f"| {size_mb:g} MB | {cells[0]} | {cells[1]} | {ratio} |")


if __name__ == "__main__":
    main()
