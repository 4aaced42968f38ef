"""A realistic stored study, built through Optuna's public API per docs/architecture.md.

The figures follow the field notes (RTX 4080 Super 32 GB, Qwen3.6-27B AWQ):
fp8 KV holds ~1.7x the tokens of bf16, the KV pool OOMs past ~13 GiB (12 GiB
with MTP), MTP helps at low concurrency. One baseline, several ok trials, OOMs
with a positive ``oom`` constraint, a crash and an SLO violation.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autotune.config.trial_config import TrialConfig
from autotune.replay.records import Percentiles, ReplayStats
from autotune.trial.record import TrialRecord
from autotune.vocabulary import (
    Failure,
    FailureClass,
    HardwareFingerprint,
    Outcome,
    ServerStats,
    StartupReport,
)
from autotune.workload.expand import load_plan

MODEL = "qwen3.6-27b-awq"
SAMPLE_WORKLOAD = Path(__file__).resolve().parents[2] / "workloads" / "sample-claudecode.jsonl"
WHAT_IF_SPACE = Path(__file__).resolve().parent / "data" / "what-if.yaml"  # tuned per GPU
GIB = 1 << 30
TOKENS_PER_GIB = {"auto": 128_341 / 9, "fp8_e4m3": 220_013 / 9}
TOKENS_PER_SESSION = 9_000
LOAD_CONCURRENCY = 32
KV_CEILING_GIB = 13.0
MTP_COST_GIB = 1.0
TTFT_SLO_S = 12.0

DISTRIBUTIONS = {
    "kv_cache_memory_gib": FloatDistribution(4.0, 15.0, step=0.5),
    "kv_cache_dtype": CategoricalDistribution(["auto", "fp8_e4m3"]),
    "max_num_seqs": IntDistribution(4, 64, log=True),
    "num_speculative_tokens": IntDistribution(0, 3),
    "enable_prefix_caching": CategoricalDistribution([True, False]),
}
HARDWARE = HardwareFingerprint(
    gpu_name="NVIDIA GeForce RTX 4080 SUPER 32GB", memory_bytes=32 * GIB, source="simulator"
)


@dataclass(frozen=True)
class Point:
    kv_gib: float
    dtype: str
    max_num_seqs: int
    mtp: int
    prefix: bool = True
    crash: bool = False
    baseline: bool = False


POINTS = [
    Point(6.0, "auto", 16, 0, baseline=True),  # 0: the baseline
    Point(9.0, "auto", 16, 0),
    Point(9.0, "fp8_e4m3", 32, 0),
    Point(11.0, "fp8_e4m3", 32, 1),
    Point(14.0, "fp8_e4m3", 32, 0),  # OOM: past the ceiling
    Point(12.5, "fp8_e4m3", 48, 2),  # OOM: past the ceiling less MTP
    Point(10.0, "fp8_e4m3", 8, 2),
    Point(12.0, "fp8_e4m3", 64, 0),
    Point(8.0, "auto", 64, 3, prefix=False),  # SLO violated: TTFT blows up
    Point(10.5, "fp8_e4m3", 24, 1, crash=True),  # engine died under load
    Point(12.0, "auto", 32, 0),
    Point(13.5, "auto", 16, 0),  # OOM
    Point(7.0, "fp8_e4m3", 16, 1),
]


def trial_config(point: Point) -> TrialConfig:
    flags: dict[str, object] = {
        "kv-cache-memory-bytes": int(point.kv_gib * GIB),
        "kv-cache-dtype": point.dtype,
        "max-num-seqs": point.max_num_seqs,
        "max-num-batched-tokens": 4096,
        "enable-prefix-caching": point.prefix,
        "language-model-only": True,
    }
    if point.mtp:
        flags["speculative-config"] = {"method": "mtp", "num_speculative_tokens": point.mtp}
    return TrialConfig(model=MODEL, flags=flags)


def _ceiling_gib(point: Point) -> float:
    return KV_CEILING_GIB - (MTP_COST_GIB if point.mtp else 0.0)


def _measure(point: Point) -> tuple[StartupReport, ReplayStats, ServerStats]:
    kv_tokens = int(point.kv_gib * TOKENS_PER_GIB[point.dtype])
    running = min(point.max_num_seqs, kv_tokens // TOKENS_PER_SESSION, LOAD_CONCURRENCY)
    mtp_gain = 1 + point.mtp * 0.35 * max(0.0, 1 - running / 16)
    tok_s = 38.0 * running**0.8 * mtp_gain * (1.0 if point.prefix else 0.7)
    waiting = LOAD_CONCURRENCY - running
    ttft_p95 = 0.8 + 0.4 * waiting * (1.0 if point.prefix else 2.0)
    tpot_p95 = 0.025 + 0.0015 * running
    duration = 300.0
    completed = int(tok_s * duration / 256)
    replay = ReplayStats(
        duration_s=duration,
        completed=completed,
        failed=0,
        total_input_tokens=completed * 6000,
        total_output_tokens=int(tok_s * duration),
        request_throughput_rps=completed / duration,
        output_throughput_tok_s=tok_s,
        total_token_throughput_tok_s=tok_s + completed * 6000 / duration,
        ttft=Percentiles(mean=ttft_p95 / 2, p50=ttft_p95 / 2, p95=ttft_p95, p99=ttft_p95 * 1.2),
        tpot=Percentiles(mean=tpot_p95 * 0.8, p50=tpot_p95 * 0.8, p95=tpot_p95),
        e2e=Percentiles(mean=ttft_p95 + 200 * tpot_p95, p95=ttft_p95 + 256 * tpot_p95),
        max_concurrent_requests=LOAD_CONCURRENCY,
    )
    startup = StartupReport(
        engine_version="autotune-sim 0.1.0",
        device="GPU",
        kv_cache_tokens=kv_tokens,
        kv_cache_gib=point.kv_gib,
        weights_gib=18.33,
        ready_s=41.0,
    )
    stats = ServerStats(
        prefix_cache_hit_rate=0.45 if point.prefix else 0.0,
        peak_running=running,
        peak_waiting=waiting,
        peak_kv_cache_usage=0.97,
        kv_cache_tokens=kv_tokens,
        spec_decode_acceptance_rate=0.62 if point.mtp else None,
        spec_decode_mean_acceptance_length=1 + 0.62 * point.mtp if point.mtp else None,
        scrapes=30,
    )
    return startup, replay, stats


def _params(point: Point) -> dict[str, object]:
    return {
        "kv_cache_memory_gib": point.kv_gib,
        "kv_cache_dtype": point.dtype,
        "max_num_seqs": point.max_num_seqs,
        "num_speculative_tokens": point.mtp,
        "enable_prefix_caching": point.prefix,
    }


def build_study(
    storage_url: str,
    name: str,
    *,
    multi_objective: bool = False,
    points: list[Point] | None = None,
) -> optuna.Study:
    """Create and fill a study the way autotune's spine stores one."""
    objectives = ["throughput", "latency"] if multi_objective else ["throughput"]
    directions = ["maximize", "minimize"] if multi_objective else ["maximize"]
    study = optuna.create_study(study_name=name, storage=storage_url, directions=directions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(objectives)
    for key, value in {
        "autotune_version": "0.1.0",
        "engine": "sim",
        "engine_version": "autotune-sim 0.1.0",
        "hardware": HARDWARE.model_dump(mode="json"),
        "model": MODEL,
        "workload": {
            "path": "workloads/sample-claudecode.jsonl",
            "name": "sample-claudecode",
            "digest": "sha256:0123abcd",
            "requests": 240,
            "sessions": 32,
        },
        "load": {"mode": "sessions", "concurrency": LOAD_CONCURRENCY},
        "objectives": objectives,
        "directions": directions,
        "slos": [f"ttft_p95<={TTFT_SLO_S:g}s"],
        "max_error_rate": 0.01,
        "space": {"name": "qwen-4080", "digest": "sha256:feed", "path": "search_spaces/x.yaml"},
        "time_scale": 20.0,
    }.items():
        study.set_user_attr(key, value)

    worst = None
    for point in POINTS if points is None else points:
        config = trial_config(point)
        oom_margin = point.kv_gib / _ceiling_gib(point) - 1
        common = {
            "config": config,
            "argv": ["vllm", "serve", *config.vllm_args()],
            "is_baseline": point.baseline,
            "engine_version": "autotune-sim 0.1.0",
            "hardware": HARDWARE,
            "memory": {
                "kv_cache_bytes": int(point.kv_gib * GIB),
                "needed_over_available": 1 + oom_margin,
            },
            "wall_s": 60.0,
        }
        constraints = {"oom": oom_margin, "crash": -1.0, "error_rate": -0.01}
        if oom_margin > 0:
            record = TrialRecord(
                **common,
                outcome=FailureClass.KV_DOES_NOT_FIT,
                failure=Failure(
                    failure_class=FailureClass.KV_DOES_NOT_FIT,
                    message="ValueError: No available memory for the cache blocks.",
                    exit_code=1,
                ),
            )
            constraints["slo:ttft_p95"] = 0.0
            values = worst
        elif point.crash:
            startup, _, _ = _measure(point)
            record = TrialRecord(
                **common,
                outcome=FailureClass.ENGINE_DEAD,
                startup=startup,
                failure=Failure(
                    failure_class=FailureClass.ENGINE_DEAD,
                    message="EngineDeadError: EngineCore encountered an issue.",
                ),
            )
            constraints["crash"] = 1.0
            constraints["slo:ttft_p95"] = 0.0
            values = worst
        else:
            startup, replay, stats = _measure(point)
            slo_margin = replay.ttft.p95 / TTFT_SLO_S - 1
            constraints["slo:ttft_p95"] = slo_margin
            record = TrialRecord(
                **common,
                outcome=Outcome.OK if slo_margin <= 0 else Outcome.SLO_VIOLATED,
                startup=startup,
                replay=replay,
                server_stats=stats,
            )
            values = [replay.output_throughput_tok_s]
            if multi_objective:
                values.append(replay.e2e.p95)
            if slo_margin <= 0 and (worst is None or values[0] < worst[0]):
                worst = values
        study.add_trial(
            optuna.trial.create_trial(
                values=values or ([1.0, 100.0] if multi_objective else [1.0]),
                params=_params(point),
                distributions=DISTRIBUTIONS,
                user_attrs=record.attrs(),
                constraints=constraints,
            )
        )
    return study


def on_the_catalog_gpu(storage_url: str, name: str) -> None:
    """Point a fixture study at the real sample workload and the simulator's 4080 Super,
    so the simulator can predict its configs (what-if, the report's sweep)."""
    study = optuna.load_study(study_name=name, storage=storage_url)
    plan = load_plan(SAMPLE_WORKLOAD)
    study.set_user_attr(
        "workload",
        {"path": str(SAMPLE_WORKLOAD), "name": plan.name, "digest": plan.digest},
    )
    study.set_user_attr("load", {"mode": "sessions", "concurrency": 8, "max_requests": 24})
    study.set_user_attr("hardware", {"gpu_name": "rtx4080s-32g", "source": "simulator"})
    study.set_user_attr("space", {"name": "what-if", "path": str(WHAT_IF_SPACE)})  # no digest


@pytest.fixture
def storage_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'studies.db'}"


@pytest.fixture(scope="session")
def study_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A storage holding the single-objective study ``qwen-4080``. Read-only: shared."""
    url = f"sqlite:///{tmp_path_factory.mktemp('so') / 'studies.db'}"
    build_study(url, "qwen-4080")
    return url


@pytest.fixture(scope="session")
def pareto_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A storage holding the throughput/latency study ``qwen-4080-mo``. Read-only: shared."""
    url = f"sqlite:///{tmp_path_factory.mktemp('mo') / 'studies.db'}"
    build_study(url, "qwen-4080-mo", multi_objective=True)
    return url
