"""The predictor's fast paths give the very floats the step-by-step simulator gives.

Decode runs are computed a chunk at a time (durations as arrays, MTP acceptance drawn
before the clock), and a plan's prompts and prefix hashes are kept between predictions:
a warm start predicts 1,707 configs and none of it may move a prediction by one bit.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import pytest

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.replay.load import LoadSpec
from autotune.sim.model.config import SimConfig
from autotune.sim.model.memory import plan_memory
from autotune.sim.model.timing import DecodeSteps, RooflineTimeModel, decode_times_s
from autotune.sim.model.units import GIB
from autotune.sim.virtual.predict import predict
from autotune.workload import load_plan

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "workloads" / "sample-claudecode.jsonl"

# The Prediction JSON of each case (sha256, 16 hex) as 6e1cab5 computed it, before the
# fast paths (re-recorded when the memory report gained tensor_parallel_size: one new
# field, every number the same): plain decode runs, MTP 1-3, LMCache, fp8, a pool so
# small it preempts, with and without step noise. A deliberate change to the simulator's
# model changes these: then record them anew (print ``digest(case, noise)`` for each).
CASES = {
    "plain": {"kv_cache_memory_bytes": 9 * GIB, "max_num_seqs": 8, "max_num_batched_tokens": 2048},
    "mtp3-fp8": {
        "kv_cache_memory_bytes": 9 * GIB,
        "kv_cache_dtype": "fp8_e4m3",
        "num_speculative_tokens": 3,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,
    },
    "mtp2-lmcache": {
        "kv_cache_memory_bytes": 7 * GIB,
        "num_speculative_tokens": 2,
        "lmcache": True,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 1599,
    },
    "tight-kv": {
        "kv_cache_memory_bytes": 6 * GIB,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
    },
    "mtp1-tight": {
        "kv_cache_memory_bytes": 6 * GIB,
        "num_speculative_tokens": 1,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 1024,
    },
}
RECORDED = {
    "plain@0.0": "fc21503b7dcd19d2",
    "plain@0.05": "96df6ab5c587eba6",
    "mtp3-fp8@0.0": "3891234be8460b5f",
    "mtp3-fp8@0.05": "31ac6bf2419f040c",
    "mtp2-lmcache@0.0": "29b041e6a1a0b0c4",
    "mtp2-lmcache@0.05": "958dcdefd5958f4f",
    "tight-kv@0.0": "d27005fb973e780d",
    "tight-kv@0.05": "bc54844af9dfbfa2",
    "mtp1-tight@0.0": "43191552f9990be8",
    "mtp1-tight@0.05": "26cf7db743c6ed61",
}


def qwen(**flags: object) -> SimConfig:
    return SimConfig.model_validate(
        {
            "model": "qwen3.6-27b-awq",
            "hardware": "rtx4080s-32g",
            "language_model_only": True,
            "enable_prefix_caching": True,
            "max_model_len": 34496,
            **flags,
        }
    )


@pytest.fixture(scope="module")
def plan():
    return load_plan(SAMPLE)


def digest(plan, case: str, noise: float) -> str:
    prediction = predict(qwen(**CASES[case]), plan, LoadSpec(concurrency=8), seed=3, noise=noise)
    return hashlib.sha256(prediction.model_dump_json().encode()).hexdigest()[:16]


@pytest.mark.parametrize("noise", [0.0, 0.05])
@pytest.mark.parametrize("case", list(CASES))
def test_predictions_are_the_ones_recorded_before_the_fast_paths(
    plan, case: str, noise: float
) -> None:
    assert digest(plan, case, noise) == RECORDED[f"{case}@{noise}"]


def test_a_plan_predicted_again_gives_the_same_bytes(plan) -> None:
    """Prompts and prefix hashes kept from the first prediction change nothing."""
    assert digest(plan, "mtp2-lmcache", 0.0) == digest(plan, "mtp2-lmcache", 0.0)


@pytest.mark.parametrize("mtp", [0, 1, 3])
def test_decode_times_equal_step_time_bit_for_bit(mtp: int) -> None:
    config = qwen(kv_cache_memory_bytes=9 * GIB, num_speculative_tokens=mtp, max_num_seqs=64)
    memory = plan_memory(config)
    model = RooflineTimeModel(
        get_gpu(config.hardware), get_model(config.model), memory, enforce_eager=False
    )
    draw = random.Random(mtp)
    for num_seqs in (1, 3, 8, 17, 64):  # inside and past the capture sizes
        contexts = np.array(sorted(draw.randrange(0, 2_000_000) for _ in range(50)))
        steps = DecodeSteps(num_seqs, mtp, contexts)
        batch = model.decode_times_s(steps)
        one_by_one = [model.step_time_s(steps.shape(i)) for i in range(len(contexts))]
        assert batch.tolist() == one_by_one  # exact, not approx
        # A model without the batch form is asked step by step, with the same result.
        assert decode_times_s(_StepByStep(model), steps).tolist() == one_by_one


class _StepByStep:
    """A time model with no batch form (any ``StepTimeModel``)."""

    def __init__(self, model: RooflineTimeModel) -> None:
        self.step_time_s = model.step_time_s
