"""How much the simulator's prediction moves for a change that should barely move it.

The tuner ranks configs by predicted throughput and re-predicts them when it learns
MTP acceptance from a measured trial, so a prediction has to move with what changed.
For a few configs of the README's case (RTX 4080 Super 32 GB, Qwen3.6-27B 4-bit, the
sample Claude Code workload), this predicts the throughput with the catalog's MTP
acceptance scaled by 1 +- 0.1% ... 0.5% (ten changes a real measurement could never
tell apart) and prints, per config, the largest and the typical (sd) relative change.
Run it on two commits to compare simulators.

    python scripts/bench_sim_jitter.py
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from autotune.config.derive import capture_sizes
from autotune.replay.load import LoadSpec
from autotune.sim.model.config import SimConfig
from autotune.sim.server.flags import parse_serve_args
from autotune.sim.virtual.predict import catalog_acceptance, predict
from autotune.workload.expand import load_plan
from autotune.workload.plan import WorkloadPlan

REPO = Path(__file__).resolve().parents[1]
CHANGES = (-0.005, -0.004, -0.003, -0.002, -0.001, 0.001, 0.002, 0.003, 0.004, 0.005)
CONFIGS = {  # name -> (max-num-seqs, KV GiB, max-num-batched-tokens, MTP k, LMCache)
    "MTP 3, 6 seqs, 10.5 GiB, 1024": (6, 10.5, 1024, 3, False),
    "MTP 3, 8 seqs, 11 GiB, 1024": (8, 11.0, 1024, 3, False),
    "MTP 2, 16 seqs, 9 GiB, 1536": (16, 9.0, 1536, 2, False),
    "MTP 3, 16 seqs, 8 GiB, LMCache": (16, 8.0, 1599, 3, True),
    "MTP 1, 8 seqs, 9 GiB, 2048": (8, 9.0, 2048, 1, False),
}


def throughput(config: SimConfig, plan: WorkloadPlan, scale: float) -> float:
    """Predicted output tok/s with the catalog's MTP acceptance scaled by ``scale``."""
    rates = catalog_acceptance(config.model, plan)
    scaled = config.model_copy(update={"mtp_acceptance": tuple(r * scale for r in rates)})
    return predict(scaled, plan, LoadSpec()).stats.output_throughput_tok_s


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    plan = load_plan(REPO / "workloads" / "sample-claudecode.jsonl")
    print(f"{'config':34s} {'largest change':>15s} {'sd of change':>13s}")
    for name, (seqs, kv_gib, batched, k, lmcache) in CONFIGS.items():
        argv = [
            "qwen3.6-27b-awq",
            *("--hardware", "rtx4080s-32g", "--language-model-only", "--enable-prefix-caching"),
            *("--max-model-len", "34496", "--max-num-seqs", str(seqs)),
            *("--max-num-batched-tokens", str(batched)),
            *("--kv-cache-memory-bytes", str(int(kv_gib * 2**30))),
            *("--speculative-config", f'{{"method": "mtp", "num_speculative_tokens": {k}}}'),
            *("--compilation-config", json.dumps({"cudagraph_capture_sizes": capture_sizes(seqs)})),
        ]
        if lmcache:
            argv += [
                "--kv-transfer-config",
                '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}',
            ]
        config = parse_serve_args(argv).sim
        base = throughput(config, plan, 1.0)
        moved = [throughput(config, plan, 1.0 + change) / base - 1.0 for change in CHANGES]
        largest = max(moved, key=abs)
        print(f"{name:34s} {largest:+15.2%} {statistics.pstdev(moved):13.2%}")


if __name__ == "__main__":
    main()
