"""MTP acceptance by common random numbers: a request's draws do not depend on the rest.

The tuner ranks configs by the simulator's predictions and re-predicts when it
learns the acceptance rate; a prediction must move with what changed, not with a
reshuffle of one random stream shared by every request.
"""

from __future__ import annotations

from pathlib import Path

from autotune.replay.load import LoadSpec
from autotune.sim.model.scheduler import SimEngineCore, SimRequest
from autotune.sim.server.flags import parse_serve_args
from autotune.sim.virtual.predict import catalog_acceptance, predict
from autotune.workload.expand import load_plan
from tests.sim.test_scheduler import prompt, qwen, run

SAMPLE = Path(__file__).resolve().parents[2] / "workloads" / "sample-claudecode.jsonl"


def tokens_per_step(engine: SimEngineCore, request_id: str) -> list[int]:
    return [o.new_tokens for r in run(engine) for o in r.outputs if o.request_id == request_id]


def test_a_request_meets_the_same_draws_alone_or_in_a_batch() -> None:
    alone = SimEngineCore(qwen(num_speculative_tokens=3), seed=5)
    alone.add_request(SimRequest("mine", prompt(0, 200), 120))
    crowded = SimEngineCore(qwen(num_speculative_tokens=3), seed=5)
    for index in range(4):
        crowded.add_request(SimRequest(f"other{index}", prompt(1000 * (index + 1), 300), 90))
    crowded.add_request(SimRequest("mine", prompt(0, 200), 120))
    mine = tokens_per_step(alone, "mine")
    assert len(set(mine)) > 2  # drafts were both accepted and rejected
    assert tokens_per_step(crowded, "mine") == mine


def test_a_tiny_change_in_acceptance_moves_a_prediction_a_little() -> None:
    plan = load_plan(SAMPLE)
    argv = [
        "qwen3.6-27b-awq",
        *("--hardware", "rtx4080s-32g", "--language-model-only", "--enable-prefix-caching"),
        *("--max-model-len", "34496", "--max-num-seqs", "6", "--max-num-batched-tokens", "1024"),
        *("--kv-cache-memory-bytes", str(int(10.5 * 2**30))),
        *("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}'),
    ]
    config = parse_serve_args(argv).sim
    rates = catalog_acceptance(config.model, plan)

    def throughput(scale: float) -> float:
        scaled = config.model_copy(update={"mtp_acceptance": tuple(r * scale for r in rates)})
        return predict(scaled, plan, LoadSpec()).stats.output_throughput_tok_s

    base = throughput(1.0)
    moved = [throughput(1.0 + change) / base for change in (-0.003, -0.001, 0.001, 0.003)]
    assert all(abs(ratio - 1.0) < 0.01 for ratio in moved), moved
