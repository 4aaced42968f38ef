"""Write workloads/claude-code-traces-sample/: small Claude Code traces, written by us.

The files follow the format of the public Claude Code traces (Weka / SemiAnalysis
``cc-traces``, as in kv-cache-tester's ``traces/``: one JSON file per session, 64-token
``hash_ids``, think times, subagents) so that ``autotune workload import`` can be tried
on a fresh clone. The figures are synthetic (a seeded generator below, shaped like
those traces: a ~15k-token tools + system prefix, a context that grows turn by turn,
short tool think times and long human ones, one subagent); they are not recorded
traffic. Run it again to rewrite the sample: the output is the same for the same seed.

    python scripts/make_trace_sample.py [--seed 7] [--out workloads/claude-code-traces-sample]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

BLOCK = 64
MODEL = "claude-sonnet-4-5-20250929"
TOOL_TOKENS = 12_416  # the tools' definitions, as the traces count them
SYSTEM_TOKENS = 2_752


class _Context:
    """One thread's prompt: its hash ids grow as turns append text."""

    def __init__(self, rng: random.Random, first_id: int) -> None:
        self.rng = rng
        self.tokens = TOOL_TOKENS + SYSTEM_TOKENS
        self.next_id = first_id
        self.ids = self._new(self.tokens)

    def _new(self, tokens: int) -> list[int]:
        count = -(-tokens // BLOCK)
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids

    def append(self, tokens: int) -> None:
        """A turn's text: the last, partly filled block is rewritten, new blocks follow."""
        full = self.tokens // BLOCK
        self.ids = self.ids[:full]
        self.tokens += tokens
        self.ids += self._new(self.tokens - full * BLOCK)


def _request(
    rng: random.Random, context: _Context, t_s: float, think_s: float, kind: str
) -> dict[str, Any]:
    out = max(8, int(rng.lognormvariate(5.4, 0.9)))
    ttft = round(0.4 + context.tokens / 40_000 + rng.random(), 2)
    return {
        "t": round(t_s, 1),
        "type": kind,
        "model": MODEL,
        "in": context.tokens,
        "out": out,
        "hash_ids": list(context.ids),
        "input_types": ["text"],
        "output_types": ["text" if rng.random() < 0.4 else "tool_use"],
        "stop": "tool_use" if rng.random() < 0.7 else "end_turn",
        "api_time": round(ttft + out / 55, 2),
        "ttft": ttft,
        "think_time": round(think_s, 1),
    }


def _trace(rng: random.Random, index: int, *, requests: int, subagent: bool) -> dict[str, Any]:
    main = _Context(rng, first_id=1)
    t_s, think_s = 0.0, 0.0
    out: list[dict[str, Any]] = []
    last: dict[str, Any] = {}
    for turn in range(requests):
        if turn:
            human = rng.random() < 0.15  # the user reads and types; else a tool runs
            think_s = rng.uniform(40, 240) if human else rng.lognormvariate(1.2, 0.8)
            main.append(int(rng.lognormvariate(6.2, 1.0)) + last["out"])
            t_s += last["api_time"] + think_s
        last = _request(rng, main, t_s, think_s, "s" if turn == 0 else "n")
        out.append(last)
        if subagent and turn == requests // 2:
            helper = _Context(rng, first_id=main.next_id + 10_000)
            helper.append(int(rng.lognormvariate(6.5, 0.5)))
            calls = [_request(rng, helper, 0.0, 0.0, "s")]
            for _ in range(3):
                helper.append(int(rng.lognormvariate(6.0, 0.8)) + calls[-1]["out"])
                step_s = calls[-1]["api_time"] + rng.lognormvariate(0.8, 0.6)
                calls.append(_request(rng, helper, calls[-1]["t"] + step_s, step_s, "n"))
            duration_ms = int(1000 * (calls[-1]["t"] + calls[-1]["api_time"]))
            out.append(
                {
                    "t": round(t_s + 1.0, 1),
                    "type": "subagent",
                    "agent_id": f"a{index}",
                    "tool_tokens": TOOL_TOKENS,
                    "system_tokens": 1_536,
                    "duration_ms": duration_ms,
                    "requests": calls,
                }
            )
    inputs = sum(r["in"] for r in out if r["type"] != "subagent")
    outputs = sum(r["out"] for r in out if r["type"] != "subagent")
    return {
        "id": f"sample_{index:02d}",
        "models": [MODEL],
        "block_size": BLOCK,
        "hash_id_scope": "local",
        "tool_tokens": TOOL_TOKENS,
        "system_tokens": SYSTEM_TOKENS,
        "requests": out,
        "totals": {"parent_tokens": {"input": inputs, "output": outputs}},
        "note": "synthetic (scripts/make_trace_sample.py), in the cc-traces format",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("workloads/claude-code-traces-sample"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for index, (requests, subagent) in enumerate([(14, False), (10, True), (12, False)]):
        trace = _trace(rng, index, requests=requests, subagent=subagent)
        path = args.out / f"sample_{index:02d}.json"
        path.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
        print(f"wrote {path}: {len(trace['requests'])} records")


if __name__ == "__main__":
    main()
