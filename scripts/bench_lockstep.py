"""Do a trial's figures on the simulator move with the host's load? Lockstep against wall time.

Each run launches a fresh simulator for one config (the engine autotune's trials use,
``SimEngine``) and replays the sample workload against it, either on scaled wall time
(the baseline: the replay before lockstep, still what ``autotune replay`` does) or in
lockstep with the simulator's clock (ours: what trials do now). Every combination runs
``--repeats`` times quiet and as often beside a CPU hog (a Python busy loop on every core
plus one), alternating. The table shows, per mode and config, the output throughput and
p95 TTFT spread over all those runs (max / min - 1) and the mean wall time of a replay,
quiet and hogged; the last rows give ours / baseline.

    nice -n 10 python scripts/bench_lockstep.py [--repeats 2] [--max-requests 24] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autotune.config.trial_config import TrialConfig
from autotune.engines.sim import SimEngine
from autotune.replay.load import LoadSpec
from autotune.replay.runner import replay
from autotune.workload import load_plan

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
BASE_FLAGS = {
    "language-model-only": True,
    "enable-prefix-caching": True,
    "max-model-len": 34_400,
    "kv-cache-memory-bytes": 9 << 30,
    "max-num-batched-tokens": 2048,
}
CONFIGS = {
    "baseline (8 seqs)": {"max-num-seqs": 8},
    "MTP 2, 8 seqs": {
        "max-num-seqs": 8,
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 2},
    },
}


@contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    hogs = (
        [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range((os.cpu_count() or 1) + 1)
        ]
        if on
        else []
    )
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)


async def one_run(config: TrialConfig, *, lockstep: bool, max_requests: int) -> dict[str, float]:
    plan = load_plan(WORKLOAD)
    load = LoadSpec(mode="sessions", concurrency=8, max_requests=max_requests)
    engine = SimEngine(hardware="rtx4080s-32g")
    with tempfile.TemporaryDirectory() as tmp:
        async with engine.launch(
            config, log_path=Path(tmp) / "server.log", startup_timeout_s=120
        ) as server:
            started = time.perf_counter()
            result = await replay(
                url=server.url,
                plan=plan,
                load=load,
                model_name=server.served_model_name,
                server_time_scale=server.time_scale,
                lockstep=lockstep,
            )
            wall_s = time.perf_counter() - started
    stats = result.stats
    return {
        "tok_s": stats.output_throughput_tok_s,
        "ttft_p95_s": stats.ttft.p95 or 0.0,
        "wall_s": wall_s,
    }


def _spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if min(values) > 0 else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-requests", type=int, default=24)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs: dict[tuple[str, str, bool], list[dict[str, float]]] = {}
    for _ in range(args.repeats):
        for hog in (False, True):
            with cpu_hog(hog):
                for name, flags in CONFIGS.items():
                    config = TrialConfig(model="qwen3.6-27b-awq", flags=BASE_FLAGS | flags)
                    for mode in ("wall", "lockstep"):
                        figures = asyncio.run(
                            one_run(
                                config,
                                lockstep=mode == "lockstep",
                                max_requests=args.max_requests,
                            )
                        )
                        runs.setdefault((mode, name, hog), []).append(figures)
    rows = []
    for mode in ("wall", "lockstep"):
        for name in CONFIGS:
            both = runs[(mode, name, False)] + runs[(mode, name, True)]
            rows.append(
                {
                    "mode": mode,
                    "config": name,
                    "tok_s": [round(r["tok_s"], 3) for r in both],
                    "tok_s_spread": _spread([r["tok_s"] for r in both]),
                    "ttft_p95_spread": _spread([r["ttft_p95_s"] for r in both]),
                    "wall_quiet_s": statistics.mean(r["wall_s"] for r in runs[(mode, name, False)]),
                    "wall_hog_s": statistics.mean(r["wall_s"] for r in runs[(mode, name, True)]),
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"One config's figures, {args.repeats} quiet + {args.repeats} hogged runs")
    for column in ("mode", "config", "tok/s (every run)", "tok/s spread", "p95 TTFT spread",
                   "wall quiet (s)", "wall hogged (s)"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("mode", "config") else "right")
    for row in rows:
        table.add_row(
            row["mode"], row["config"], " ".join(f"{v:.1f}" for v in row["tok_s"]),
            f"{row['tok_s_spread']:.2%}", f"{row['ttft_p95_spread']:.2%}",
            f"{row['wall_quiet_s']:.1f}", f"{row['wall_hog_s']:.1f}",
        )  # fmt: skip
    for name in CONFIGS:
        wall = next(r for r in rows if r["mode"] == "wall" and r["config"] == name)
        ours = next(r for r in rows if r["mode"] == "lockstep" and r["config"] == name)
        table.add_row(
            "ours / baseline", name, "",
            f"{ours['tok_s_spread'] / wall['tok_s_spread']:.3f}" if wall["tok_s_spread"] else "-",
            f"{ours['ttft_p95_spread'] / wall['ttft_p95_spread']:.3f}"
            if wall["ttft_p95_spread"] else "-",
            f"{ours['wall_quiet_s'] / wall['wall_quiet_s']:.2f}",
            f"{ours['wall_hog_s'] / wall['wall_hog_s']:.2f}",
        )  # fmt: skip
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
