"""Configs the simulator models alike are predicted once (fp8_e4m3 and fp8_e5m2 KV: the
same bytes and speed), and each of them gets the prediction of both."""

from __future__ import annotations

from pathlib import Path

from autotune.config.trial_config import TrialConfig
from autotune.replay.load import LoadSpec
from autotune.trial.objective import Goal
from autotune.tuner.predictor import SimOracle, modelled_alike, predict_all
from autotune.workload.expand import load_plan

REPO = Path(__file__).resolve().parents[2]


def _oracle() -> SimOracle:
    return SimOracle(
        hardware="rtx4080s-32g",
        sim_model="qwen3.6-27b-awq",
        plan=load_plan(REPO / "workloads" / "sample-claudecode.jsonl"),
        load=LoadSpec(concurrency=4, max_requests=12),
        goal=Goal(objectives=["throughput"], slos=[]),
    )


def _config(dtype: str, mtp: int = 0, seqs: int = 8) -> TrialConfig:
    flags: dict = {
        "max-model-len": 40000,
        "enable-prefix-caching": True,
        "language-model-only": True,
        "kv-cache-memory-bytes": "9G",
        "kv-cache-dtype": dtype,
        "max-num-seqs": seqs,
    }
    if mtp:
        flags["speculative-config"] = {"method": "mtp", "num_speculative_tokens": mtp}
    return TrialConfig(model="qwen3.6-27b-awq", flags=flags)


def test_fp8_formats_share_one_prediction_and_other_configs_do_not() -> None:
    """Before: every config was predicted on its own (no ``modelled_alike``)."""
    configs = [
        _config("fp8_e4m3"),
        _config("fp8_e5m2"),
        _config("auto"),
        _config("fp8", seqs=4),
        _config("fp8_e4m3", seqs=4),
        _config("fp8_e5m2", mtp=2),
        _config("fp8_e4m3", mtp=2),
    ]
    slots, distinct = modelled_alike(_oracle(), configs)
    assert slots == [0, 0, 1, 2, 2, 3, 3]
    assert distinct == [configs[0], configs[2], configs[3], configs[5]]


def test_the_shared_prediction_is_what_each_config_predicts_alone() -> None:
    """The claim behind the sharing: the model predicts the twins exactly alike (memory,
    speed, MTP acceptance draws), so sharing changes no score."""
    oracle = _oracle()
    configs = [_config("fp8_e4m3", mtp=2), _config("fp8_e5m2", mtp=2), _config("auto", mtp=2)]
    shared = predict_all(oracle, configs, workers=1)
    alone = [oracle.score(config) for config in configs]
    assert shared == alone
    assert shared[0] == shared[1] and shared[0] != shared[2]
