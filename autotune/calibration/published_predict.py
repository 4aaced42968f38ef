"""A published run, predicted: its server as a ``SimConfig``, its benchmark as a plan and a
load (``autotune bench serve``'s), replayed in-process at the catalog's constants.

What a source does not state is filled in the same way for every point:

- the model: the catalog entry of its architecture and weight format (``CATALOG_MODEL``;
  a fine-tune or distill runs as its base architecture); a model with no entry is not
  predicted, and the table says so;
- ``--max-model-len``: the server's, else the model's own if its KV pool holds one
  request that long, else the longest of 32K, 16K, 8K and 4K that it holds (vLLM refuses
  to start otherwise, so the source must have set one);
- lengths: a dataset with stated input and output lengths (random, synthetic, sonnet)
  draws vLLM's random lengths; ShareGPT (and datasets that name only mean lengths)
  resample the 200 ShareGPT first turns of
  ``data/sharegpt_lengths.json``, scaled so their means are the run's measured means; every
  output is forced to its length (a run without ``--ignore-eos`` reports its mean output,
  which the plan then matches).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources

import numpy as np

from autotune.calibration.published import PublishedPoint
from autotune.catalog.models import get_model
from autotune.errors import InputError
from autotune.replay.bench_datasets import BenchDataset, arrival_times_s, bench_plan
from autotune.replay.bench_serve import bench_load
from autotune.replay.load import LoadSpec
from autotune.replay.records import ReplayStats
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.config import SimConfig
from autotune.sim.model.memory import plan_memory
from autotune.sim.model.speed_constants import SpeedConstants
from autotune.sim.virtual.predict import predict
from autotune.workload.expand import expand
from autotune.workload.io import Workload
from autotune.workload.plan import WorkloadPlan
from autotune.workload.schema import (
    FORMAT_VERSION,
    FullInput,
    Header,
    Output,
    RequestRecord,
    SynthPart,
    WireMessage,
)

# Hugging Face id -> the catalog model that runs like it (same architecture and weights).
CATALOG_MODEL = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3-8B-Instruct": "llama-3.1-8b",  # Llama 3 8B: the same layers
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": "llama-3.1-8b",
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b-fp8",
    "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b-fp8",
    "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8-dynamic": "llama-3.1-8b-fp8",
    "neuralmagic/Meta-Llama-3-8B-Instruct-FP8": "llama-3.1-8b-fp8",
    "Qwen/Qwen3-8B": "qwen3-8b",
    "Qwen/Qwen3-14B": "qwen3-14b",
    "Qwen/Qwen3-14B-FP8": "qwen3-14b-fp8",
    "Qwen/Qwen3-14B-AWQ": "qwen3-14b-awq",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-32B-FP8": "qwen3-32b-fp8",
    "Qwen/Qwen3-32B-AWQ": "qwen3-32b-awq",
    "Qwen/Qwen3-VL-32B-Instruct-FP8": "qwen3-32b-fp8",  # its language model; images off
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": "qwen2.5-32b",
    "Qwen/QwQ-32B-AWQ": "qwen2.5-32b-awq",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "nvidia/Llama-3.1-70B-Instruct-FP8": "llama-3.1-70b-fp8",
    "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8-dynamic": "llama-3.1-70b-fp8",
    "mistralai/Mistral-7B-Instruct-v0.3": "mistral-7b",
}
MAX_MODEL_LEN_FALLBACKS = (32768, 16384, 8192, 4096)
SHAREGPT_SAMPLE_SEED = 0
FLAG_FIELDS = {  # server_flags keys the simulator models -> SimConfig fields
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "enable_prefix_caching": "enable_prefix_caching",
    "prefix_caching": "enable_prefix_caching",
    "enforce_eager": "enforce_eager",
}


class NotPredicted(Exception):
    """A point the simulator cannot stand for; the message says why (one line)."""


@dataclass(frozen=True)
class PredictedFigures:
    """The figures a point is held to, predicted (seconds and tokens/s)."""

    output_throughput_tok_s: float
    total_token_throughput_tok_s: float
    request_throughput_rps: float
    median_ttft_s: float | None
    mean_ttft_s: float | None
    median_tpot_s: float | None
    mean_tpot_s: float | None

    @classmethod
    def of(cls, stats: ReplayStats) -> PredictedFigures:
        return cls(
            output_throughput_tok_s=stats.output_throughput_tok_s,
            total_token_throughput_tok_s=stats.total_token_throughput_tok_s,
            request_throughput_rps=stats.request_throughput_rps,
            median_ttft_s=stats.ttft.p50,
            mean_ttft_s=stats.ttft.mean,
            median_tpot_s=stats.tpot.p50,
            mean_tpot_s=stats.tpot.mean,
        )


def catalog_model(point: PublishedPoint) -> str:
    """The catalog model ``point`` runs as; NotPredicted when there is none."""
    name = CATALOG_MODEL.get(point.model)
    if name is None:
        raise NotPredicted(f"model {point.model} is not in the simulator's catalog")
    return name


def sim_config(point: PublishedPoint) -> SimConfig:
    """The server of ``point`` as the simulator runs it."""
    values: dict[str, object] = {
        "hardware": point.gpu,
        "model": catalog_model(point),
        "tensor_parallel_size": point.tensor_parallel,
    }
    if point.kv_cache_dtype:
        values["kv_cache_dtype"] = point.kv_cache_dtype
    for key, value in (point.server_flags or {}).items():
        if key in FLAG_FIELDS:
            values[FLAG_FIELDS[key]] = value
    try:
        config = SimConfig.model_validate(values)
        if config.max_model_len is not None:
            return config
        for length in (get_model(config.model).max_model_len, *MAX_MODEL_LEN_FALLBACKS):
            sized = config.model_copy(update={"max_model_len": length})
            if plan_memory(sized).fits:
                return sized
    except InputError as exc:
        raise NotPredicted(str(exc).splitlines()[0]) from None
    raise NotPredicted(f"{config.model} does not start on {point.gpu} x{point.tensor_parallel}")


@functools.cache
def sharegpt_sample() -> tuple[np.ndarray, np.ndarray]:
    """The stored ShareGPT first turns' (input, output) token counts."""
    data = json.loads(
        resources.files("autotune.calibration")
        .joinpath("data", "sharegpt_lengths.json")
        .read_text()
    )
    return np.asarray(data["input_tokens"], float), np.asarray(data["output_tokens"], float)


def _scaled(values: np.ndarray, mean: float | None) -> list[int]:
    scaled = values * (mean / values.mean()) if mean else values
    return [max(1, round(value)) for value in scaled]


def _sampled_plan(point: PublishedPoint, count: int, arrivals_s: list[float]) -> WorkloadPlan:
    """``count`` ShareGPT-shaped requests at ``arrivals_s``, means as the run measured."""
    inputs, outputs = sharegpt_sample()
    picks = np.random.default_rng(SHAREGPT_SAMPLE_SEED).integers(0, len(inputs), size=count)
    bench = point.benchmark
    input_tokens = _scaled(inputs[picks], bench.mean_input_tokens_measured)
    output_tokens = _scaled(outputs[picks], bench.mean_output_tokens_measured)
    requests = [
        RequestRecord(
            id=f"r{index:06d}",
            t_s=round(arrivals_s[index], 6),
            input=FullInput(messages=[WireMessage(role="user", content=[SynthPart(tokens=n)])]),
            output=Output(tokens=output_tokens[index]),
            input_tokens=n,
        )
        for index, n in enumerate(input_tokens)
    ]
    header = Header(
        version=FORMAT_VERSION,
        name=f"published-{point.id}",
        endpoint="openai.completions",
        hash_scope="global",
        source={"generator": "vllm-bench", "dataset": "sharegpt"},
    )
    return expand(Workload(header, {}, requests), name=header.name)


def point_plan(point: PublishedPoint, max_open_loop: int | None = None) -> WorkloadPlan:
    """The requests of ``point``'s benchmark, with their arrivals (``max_open_loop``: at
    most this many at a set request rate, where the figures are the steady state's; a
    burst's figures depend on its size, so it is never cut)."""
    bench = point.benchmark
    count = bench.num_prompts or _count_from_duration(point)
    if max_open_loop is not None and not math.isinf(bench.request_rate):
        count = min(count, max_open_loop)
    burstiness = bench.burstiness or 1.0
    if bench.dataset != "sharegpt" and bench.input_len and bench.output_len:
        output_len = bench.output_len
        if bench.mean_output_tokens_measured:  # stopped by EOS: the mean it reached
            output_len = max(1, round(bench.mean_output_tokens_measured))
        dataset = BenchDataset(
            num_prompts=count,
            random_input_len=bench.input_len,
            random_output_len=output_len,
            random_range_ratio=bench.range_ratio or 0.0,
            ignore_eos=True,
            seed=bench.seed or 0,
        )
        return bench_plan(dataset, request_rate=bench.request_rate, burstiness=burstiness)
    if bench.dataset == "sharegpt" or bench.mean_input_tokens_measured:
        arrivals_s = arrival_times_s(
            count, bench.request_rate, burstiness=burstiness, seed=bench.seed or 0
        )
        return _sampled_plan(point, count, arrivals_s)
    raise NotPredicted(f"dataset {bench.dataset!r} without stated lengths")


def _count_from_duration(point: PublishedPoint) -> int:
    """Requests of a run that states a duration and a rate instead of a count."""
    extra = point.benchmark.model_extra or {}
    duration_s = extra.get("duration_s")
    if isinstance(duration_s, int | float) and not math.isinf(point.benchmark.request_rate):
        return max(1, round(duration_s * point.benchmark.request_rate))
    raise NotPredicted("no --num-prompts, and no duration at a finite rate")


def point_load(point: PublishedPoint, plan: WorkloadPlan) -> LoadSpec:
    """``point``'s load: ``vllm bench serve``'s for its concurrency and rate."""
    bench = point.benchmark
    return bench_load(
        num_prompts=len(plan.requests),
        max_concurrency=bench.max_concurrency,
        request_rate=bench.request_rate,
    )


def predict_point(
    point: PublishedPoint,
    constants: SpeedConstants | None = None,
    *,
    max_open_loop: int | None = None,
) -> PredictedFigures:
    """``point`` predicted in-process (``constants``: the catalog's when None;
    ``max_open_loop``: see ``point_plan``)."""
    config = sim_config(point)
    plan = point_plan(point, max_open_loop)
    try:
        calibration = None if constants is None else CalibrationProfile(constants=constants)
        prediction = predict(config, plan, point_load(point, plan), calibration=calibration)
    except InputError as exc:
        raise NotPredicted(str(exc).splitlines()[0]) from None
    if prediction.failure is not None:
        raise NotPredicted(f"predicted to fail: {prediction.failure.message}")
    return PredictedFigures.of(prediction.stats)
