"""Start-up of `autotune --help` and of a one-line error: this tree against another
checkout, interleaved in one run so the machine's load weighs on both alike.

    python scripts/bench_help.py --base DIR [--repeats 5]

``DIR`` is a checkout of the baseline (``git archive COMMIT | tar -x -C DIR``). Prints the
median wall seconds of each command per tree and their ratio, with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "autotune --help": ["--help"],
    "autotune workload stats MISSING (one-line error)": ["workload", "stats", "/nonexistent.jsonl"],
}


def wall_s(code: Path, args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(code)}
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "autotune", *args], env=env, cwd=code, capture_output=True,
        timeout=600, check=False,
    )  # fmt: skip
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the baseline checkout")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for name, argv in COMMANDS.items():
            for tree, code in (("base", args.base), ("now", REPO)):
                times.setdefault((name, tree), []).append(wall_s(code, argv))
    load = os.getloadavg()[0]
    print(f"median of {args.repeats}, interleaved; load average {load:.1f}, {os.cpu_count()} cores")
    print("| command | base s | now s | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name in COMMANDS:
        base = statistics.median(times[(name, "base")])
        now = statistics.median(times[(name, "now")])
        print(f"| {name} | {base:.2f} | {now:.2f} | {now / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
