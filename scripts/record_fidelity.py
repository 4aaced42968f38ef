"""Record the simulator's answers on a fixed set of configs: the fidelity guard's fixture.

A speed-up of the simulator must give the same answers. This script predicts a fixed
set of configs and workloads and writes what each prediction says (output tok/s, TTFT,
TPOT and E2E p50/p95, KV tokens, completed requests) to ``tests/sim/fidelity.json``;
``tests/sim/test_fidelity.py`` predicts them again and fails when one moves by more than
0.5% (KV tokens and counts exactly).

The set: configs drawn in a fixed stride from the lattices of three of
scripts/bench_tuner.py's landscapes (the README quick start on rtx4080s-32g with
workloads/sample-claudecode.jsonl, MTP 0-3 each included; H100 chat; long context on a
24 GB card), as ``autotune run`` derives them (pre-flight, max-model-len sizing,
pre-screen: those that start). Each entry keeps the simulator's config itself, so the
test needs neither the space nor the tuner.

Regenerate (only when a change of the simulator's answers is intended, and say so in
the commit):

    python scripts/record_fidelity.py [--per-case 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "sim" / "fidelity.json"
CASES = ("readme", "h100-chat", "longctx-24g")  # bench_tuner.py's landscapes


def _bench_tuner() -> Any:
    path = REPO / "scripts" / "bench_tuner.py"
    spec = importlib.util.spec_from_file_location("bench_tuner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_tuner"] = module
    spec.loader.exec_module(module)
    return module


def workload_builders() -> dict[str, Callable[[Path], Path]]:
    """Each case's workload file, written under the given folder when generated."""
    from autotune.workload.gen import ChatParams, ClaudeCodeParams, chat, claudecode
    from autotune.workload.io import write_workload

    def generated(name: str, make: Callable[[], Any]) -> Callable[[Path], Path]:
        def write(directory: Path) -> Path:
            path = directory / f"{name}.jsonl"
            write_workload(path, make().records())
            return path

        return write

    return {
        "readme": lambda _: REPO / "workloads" / "sample-claudecode.jsonl",
        "h100-chat": generated("chat", lambda: chat(ChatParams(requests=160, seed=1))),
        "longctx-24g": generated(
            "cc-long", lambda: claudecode(ClaudeCodeParams(sessions=4, seed=1, max_context=60_000))
        ),
    }


def figures(sim: dict[str, Any], plan: Any, load: dict[str, Any]) -> dict[str, Any]:
    """What one prediction says, as the guard compares it."""
    from autotune.replay.load import LoadSpec
    from autotune.sim.model.config import SimConfig
    from autotune.sim.virtual.predict import predict

    prediction = predict(SimConfig(**sim), plan, LoadSpec(**load))
    stats = prediction.stats
    return {
        "failure": None if prediction.failure is None else prediction.failure.failure_class.value,
        "kv_cache_tokens": prediction.memory.kv_cache_tokens,
        "completed": stats.completed,
        "output_tok_s": stats.output_throughput_tok_s,
        "ttft_p50_s": stats.ttft.p50,
        "ttft_p95_s": stats.ttft.p95,
        "tpot_p50_s": stats.tpot.p50,
        "tpot_p95_s": stats.tpot.p95,
        "e2e_p50_s": stats.e2e.p50,
        "e2e_p95_s": stats.e2e.p95,
    }


def pick(candidates: list[Any], oracle: Any, per_case: int) -> list[dict[str, Any]]:
    """``per_case`` configs in a fixed stride over the lattice, plus the first of each MTP k
    the stride missed; as the simulator's configs."""
    sims = [s.model_dump(mode="json") for c in candidates if (s := oracle.sim_config(c.config))]
    stride = max(1, len(sims) // per_case)
    chosen = sims[::stride][:per_case]
    for k in sorted({s["num_speculative_tokens"] for s in sims}):
        if all(s["num_speculative_tokens"] != k for s in chosen):
            chosen.append(next(s for s in sims if s["num_speculative_tokens"] == k))
    return chosen


def record(per_case: int, directory: Path) -> dict[str, Any]:
    from autotune.tuner.lattice import enumerate_effective
    from autotune.workload import load_plan

    bench = _bench_tuner()
    builders = workload_builders()
    cases = []
    for name in CASES:
        landscape = bench.LANDSCAPES[name]
        spec = bench.prepare(landscape, directory)["spec"]
        candidates = [
            c
            for c in enumerate_effective(
                spec.space, model=spec.model, engine_version=None, prescreen=spec.prescreen
            )
            if c.memory is None or c.memory.fits
        ]
        plan = load_plan(builders[name](directory))
        load = landscape.load.model_dump(mode="json")
        entries = [
            {"sim": sim, "expected": figures(sim, plan, load)}
            for sim in pick(candidates, spec.oracle, per_case)
        ]
        cases.append({"name": name, "load": load, "entries": entries})
        print(f"{name}: {len(entries)} configs of {len(candidates)}", file=sys.stderr)
    return {"cases": cases}


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-case", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fixture = record(args.per_case, Path(tmp))
    FIXTURE.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)


if __name__ == "__main__":
    main()
