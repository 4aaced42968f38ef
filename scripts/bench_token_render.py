"""What token-exact prompts cost: expanding a workload in the served model's tokenizer vs the
word approximation, and encoding each request body, per request (all before or off the
measurement window: expansion runs once before the first trial).

Usage: PYTHONPATH=. python scripts/bench_token_render.py [--tokenizer DIR] [--trace FILE]
(defaults: ~/.cache/autotune/tiny-model and the largest Claude Code trace under
../shared/data or $AUTOTUNE_SHARED_DATA, imported as `autotune workload import --from weka`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from autotune.replay.payloads import request_body
from autotune.workload.expand import expand
from autotune.workload.gen import ChatParams, chat
from autotune.workload.hf_tokenizer import load_tokenizer
from autotune.workload.importers.weka import import_weka
from autotune.workload.io import Workload
from autotune.workload.plan import WorkloadPlan

REPO = Path(__file__).resolve().parent.parent


def _timed(fn, repeat: int = 3):
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def _bodies_s(plan: WorkloadPlan) -> float:
    start = time.perf_counter()
    for request in plan.requests:
        request_body(request, model_name="m")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=str(Path.home() / ".cache/autotune/tiny-model"))
    data = Path(os.environ.get("AUTOTUNE_SHARED_DATA", REPO.parent / "shared" / "data"))
    parser.add_argument("--trace", type=Path, default=None)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.tokenizer)
    if tokenizer is None:
        raise SystemExit(f"no tokenizer at {args.tokenizer}")
    vocab_s, _ = _timed(tokenizer.synthetic_vocabulary, repeat=1)
    size = tokenizer._tokenizer.get_vocab_size()
    print(
        f"synthetic vocabulary of {tokenizer.name}: {vocab_s * 1e3:.0f} ms once for {size:,} ids "
        f"({vocab_s / size * 1e6:.1f} us an id; 152K ids: ~{vocab_s / size * 152_000:.1f} s)"
    )
    traces = sorted(
        (data / "claude-code-traces").glob("trace_*.json"), key=lambda p: p.stat().st_size
    )
    workloads: dict[str, Workload] = {
        "chat 300 x 200 tok": chat(
            ChatParams(requests=300, prompt_tokens_median=200, output_tokens_median=64)
        ),
    }
    trace = args.trace or (traces[-1] if traces else None)
    if trace is not None:
        workloads[f"Claude Code {trace.stem}"] = import_weka(trace)[0]
    print(
        "| workload | requests | prompt tokens | words: expand ms/req | "
        f"{tokenizer.name}: expand ms/req | ratio | body encode ms/req |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, workload in workloads.items():
        words_s, _ = _timed(lambda w=workload: expand(w))
        exact_s, plan = _timed(lambda w=workload: expand(w, tokenizer=tokenizer))
        n = len(plan.requests)
        tokens = sum(r.prompt_tokens for r in plan.requests)
        print(
            f"| {name} | {n} | {tokens:,} | {words_s / n * 1e3:.3f} | {exact_s / n * 1e3:.3f} | "
            f"{exact_s / words_s:.2f} | {_bodies_s(plan) / n * 1e3:.3f} |"
        )


if __name__ == "__main__":
    main()
