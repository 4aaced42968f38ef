"""`vllm bench serve`'s datasets and arrivals, as a workload plan any replay can drive.

What vLLM 0.32 samples (vllm/benchmarks/datasets/, serve.py), reproduced:

- ``random``: per request, input and output lengths drawn uniformly from integer ranges
  ``[floor(L (1 - r)), ceil(L (1 + r))]`` by ``numpy.random.default_rng(seed)`` (input
  lengths first, then output lengths: the same lengths vLLM draws for the same seed),
  after a shared prefix of ``--random-prefix-len`` tokens. vLLM's prompts are runs of
  token ids; here they are unique synthetic text of the same length in the plan's
  tokenizer, so nothing is shared but the prefix.
- ``sharegpt``: the conversations with at least two turns, shuffled by ``random.seed``
  (Python's), each one's first turn as the prompt and the second's length in tokens as
  the output length, keeping prompts of 4 to 1024 tokens with prompt + output at most
  2048 (and outputs of at least 4 unless ``--sharegpt-output-len`` fixes them).
- arrivals at ``--request-rate R``: gamma intervals of shape ``--burstiness`` (1: a
  Poisson process) and mean 1/R, their running sum rescaled so the last request arrives
  at ``num_prompts / R`` (vLLM's normalisation), drawn by ``numpy.random.seed(seed)``'s
  global generator as vLLM draws them; ``inf``: all at once.

vLLM's default endpoint is ``/v1/completions``; a completions prompt is sent as
``user: TEXT`` (``payloads.render_prompt``), so the random text is shortened by what that
costs in the tokenizer and the prompt the server counts is the drawn length.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from autotune.errors import InputError, WorkloadError
from autotune.replay.payloads import render_prompt
from autotune.workload.expand import expand
from autotune.workload.io import Workload
from autotune.workload.plan import Endpoint, Message, WorkloadPlan
from autotune.workload.schema import (
    FORMAT_VERSION,
    FullInput,
    Header,
    Output,
    PrefixRecord,
    RequestRecord,
    SynthPart,
    TextPart,
    WireMessage,
)
from autotune.workload.tokenizer import Tokenizer, WordTokenizer

DatasetName = Literal["random", "sharegpt"]
SHAREGPT_MIN_TOKENS = 4  # vLLM's is_valid_sequence
SHAREGPT_MAX_PROMPT_TOKENS = 1024
SHAREGPT_MAX_TOTAL_TOKENS = 2048
BENCH_ENDPOINT: Endpoint = "openai.completions"  # vllm bench serve's default backend


@dataclass(frozen=True)
class BenchDataset:
    """The dataset options of a ``vllm bench serve`` command line (vLLM's defaults)."""

    name: DatasetName = "random"
    num_prompts: int = 1000
    seed: int = 0
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    dataset_path: Path | None = None
    sharegpt_output_len: int | None = None
    ignore_eos: bool = False

    def check(self) -> None:
        """Raise InputError naming the flag for options vLLM would refuse."""
        if self.num_prompts < 1:
            raise InputError(f"--num-prompts must be >= 1, but got {self.num_prompts}")
        if not 0.0 <= self.random_range_ratio < 1.0:
            raise InputError(
                f"--random-range-ratio must be in [0, 1), but got {self.random_range_ratio}"
            )
        if self.random_input_len + self.random_prefix_len < 1 or self.random_output_len < 1:
            raise InputError("--random-input-len and --random-output-len must be >= 1")
        if self.name == "sharegpt" and self.dataset_path is None:
            raise InputError("--dataset-name sharegpt needs --dataset-path (a ShareGPT JSON)")


def random_lengths(dataset: BenchDataset) -> tuple[list[int], list[int]]:
    """Each request's drawn input and output length, as vLLM's ``get_sampling_params``
    draws them for the same seed (a tokenizer with no special tokens added)."""
    rng = np.random.default_rng(dataset.seed)
    ratio = dataset.random_range_ratio
    in_low = math.floor(dataset.random_input_len * (1 - ratio))
    in_high = math.ceil(dataset.random_input_len * (1 + ratio))
    out_low = max(math.floor(dataset.random_output_len * (1 - ratio)), 1)
    out_high = max(math.ceil(dataset.random_output_len * (1 + ratio)), 1)
    inputs = rng.integers(in_low, in_high + 1, size=dataset.num_prompts)
    outputs = rng.integers(out_low, out_high + 1, size=dataset.num_prompts)
    return [int(n) for n in inputs], [int(n) for n in outputs]


def arrival_times_s(count: int, rate_rps: float, *, burstiness: float, seed: int) -> list[float]:
    """When each of ``count`` requests arrives (seconds), as vLLM's ``get_request``."""
    if math.isinf(rate_rps):
        return [0.0] * count
    if rate_rps <= 0 or burstiness <= 0:
        raise InputError(
            f"--request-rate and --burstiness must be > 0, got {rate_rps} and {burstiness}"
        )
    if math.isinf(burstiness):
        delays = np.full(count, 1.0 / rate_rps)
    else:
        generator = np.random.RandomState(seed)  # vLLM: np.random.seed(seed), then gamma
        delays = generator.gamma(burstiness, 1.0 / (rate_rps * burstiness), size=count)
    times = np.cumsum(delays)
    times *= (count / rate_rps) / times[-1]
    return [float(t) for t in times]


def _completion_overhead(tokenizer: Tokenizer) -> int:
    """Tokens a completions prompt adds to its text (``user: ``)."""
    sample = " ".join(["benchmark"] * 8)
    rendered = render_prompt(None, (Message("user", sample),))
    return tokenizer.count(rendered) - tokenizer.count(sample)


def _header(dataset: BenchDataset, source: dict[str, object]) -> Header:
    return Header(
        version=FORMAT_VERSION,
        name=f"vllm-bench-{dataset.name}",
        endpoint=BENCH_ENDPOINT,
        seed=dataset.seed,
        hash_scope="global",
        source={"generator": "vllm-bench", "dataset": dataset.name, **source},
    )


def _random_workload(
    dataset: BenchDataset, arrivals_s: list[float], tokenizer: Tokenizer
) -> Workload:
    inputs, outputs = random_lengths(dataset)
    overhead = _completion_overhead(tokenizer)
    prefix = None
    prefixes: dict[str, PrefixRecord] = {}
    if dataset.random_prefix_len > 0:
        prefix = "bench.prefix"
        parts = [SynthPart(tokens=dataset.random_prefix_len)]
        prefixes[prefix] = PrefixRecord(id=prefix, system=list(parts))
    requests = [
        RequestRecord(
            id=f"r{index:06d}",
            t_s=round(arrivals_s[index], 6),
            prefix=prefix,
            input=FullInput(
                messages=[
                    WireMessage(role="user", content=[SynthPart(tokens=max(tokens - overhead, 1))])
                ]
            ),
            output=Output(tokens=outputs[index], exact=dataset.ignore_eos),
            input_tokens=tokens + dataset.random_prefix_len,
        )
        for index, tokens in enumerate(inputs)
    ]
    source = {
        "random_input_len": dataset.random_input_len,
        "random_output_len": dataset.random_output_len,
        "random_range_ratio": dataset.random_range_ratio,
        "random_prefix_len": dataset.random_prefix_len,
    }
    return Workload(_header(dataset, source), prefixes, requests)


def sharegpt_pairs(dataset: BenchDataset, tokenizer: Tokenizer) -> list[tuple[str, int, int]]:
    """(prompt text, prompt tokens, output tokens) of the conversations vLLM would take."""
    path = dataset.dataset_path
    assert path is not None  # BenchDataset.check
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read ShareGPT JSON: {exc}") from exc
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: ShareGPT must be a JSON array of conversations")
    entries = [
        entry
        for entry in data
        if isinstance(entry, dict)
        and isinstance(entry.get("conversations"), list)
        and len(entry["conversations"]) >= 2
    ]
    random.Random(dataset.seed).shuffle(entries)  # vLLM: random.seed(seed); random.shuffle
    pairs: list[tuple[str, int, int]] = []
    for index, entry in enumerate(entries):
        if len(pairs) >= dataset.num_prompts:
            break
        try:
            prompt, completion = (str(turn["value"]) for turn in entry["conversations"][:2])
        except (KeyError, TypeError) as exc:
            raise WorkloadError(f"{path}: conversation {index}: a turn without 'value'") from exc
        prompt_tokens = tokenizer.count(prompt)
        fixed = dataset.sharegpt_output_len
        output_tokens = tokenizer.count(completion) if fixed is None else fixed
        too_short = prompt_tokens < SHAREGPT_MIN_TOKENS or (
            fixed is None and output_tokens < SHAREGPT_MIN_TOKENS
        )
        too_long = (
            prompt_tokens > SHAREGPT_MAX_PROMPT_TOKENS
            or prompt_tokens + output_tokens > SHAREGPT_MAX_TOTAL_TOKENS
        )
        if not (too_short or too_long):
            pairs.append((prompt, prompt_tokens, output_tokens))
    if not pairs:
        raise WorkloadError(f"{path}: no ShareGPT conversation fits vLLM's length limits")
    return pairs


def _sharegpt_workload(
    dataset: BenchDataset, arrivals_s: list[float], tokenizer: Tokenizer
) -> Workload:
    pairs = sharegpt_pairs(dataset, tokenizer)
    requests = [
        RequestRecord(
            id=f"r{index:06d}",
            t_s=round(arrivals_s[index], 6),
            input=FullInput(messages=[WireMessage(role="user", content=[TextPart(text=prompt)])]),
            output=Output(tokens=output_tokens, exact=dataset.ignore_eos),
            input_tokens=prompt_tokens,
        )
        for index, (prompt, prompt_tokens, output_tokens) in enumerate(pairs)
    ]
    return Workload(_header(dataset, {"path": str(dataset.dataset_path)}), {}, requests)


def bench_plan(
    dataset: BenchDataset,
    *,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    tokenizer: Tokenizer | None = None,
) -> WorkloadPlan:
    """The plan ``vllm bench serve`` would send: ``dataset``'s requests, each with its
    arrival at ``request_rate`` (requests/s; inf: all at once), in ``tokenizer``'s tokens
    (the word approximation by default)."""
    dataset.check()
    tokenizer = tokenizer or WordTokenizer()
    arrivals_s = arrival_times_s(
        dataset.num_prompts, request_rate, burstiness=burstiness, seed=dataset.seed
    )
    if dataset.name == "random":
        workload = _random_workload(dataset, arrivals_s, tokenizer)
    else:
        workload = _sharegpt_workload(dataset, arrivals_s, tokenizer)
    return expand(workload, tokenizer=tokenizer, name=workload.header.name)
