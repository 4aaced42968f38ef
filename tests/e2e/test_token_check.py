"""Planned vs served prompt tokens, checked against the simulator's own usage counts."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import tokenizers

from autotune.replay.load import LoadSpec
from autotune.replay.runner import replay
from autotune.workload.expand import expand
from autotune.workload.gen import ChatParams, chat, fixed
from autotune.workload.io import write_workload
from tests.e2e.conftest import autotune_argv, start_sims, tuner_args

pytestmark = [pytest.mark.timeout(120)]

LOAD = LoadSpec(mode="concurrency", concurrency=4, saturation_stop=False)


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for start in start_sims(tmp_path_factory.mktemp("sim")):
        yield start(50.0)


def _replay(url: str, plan):
    coro = replay(url=url, plan=plan, load=LOAD, model_name="", server_time_scale=50.0)
    return asyncio.run(coro).stats.prompt_tokens_check


def test_prompts_in_the_servers_token_space_pass_with_the_template_measured(sim_url: str) -> None:
    check = _replay(sim_url, expand(fixed(requests=10, prompt_tokens=120, output_tokens=4)))
    assert check is not None and check.ok, check
    assert check.checked == 8
    # The simulator's ChatML-like template: 3 tokens a message, 2 to start the answer.
    assert check.template_tokens == 8 * (3 + 2)
    assert check.served_tokens == check.planned_tokens == 8 * (120 + 5)


def test_prompts_the_plan_miscounts_are_reported_in_plain_words(sim_url: str) -> None:
    # A plan whose counts are not the served model's: it says 60 tokens where it sends 120
    # words (what a plan in the wrong tokenizer does).
    plan = expand(fixed(requests=10, prompt_tokens=120, output_tokens=4))
    halved = tuple(replace(r, prompt_tokens=r.prompt_tokens // 2) for r in plan.requests)
    check = _replay(sim_url, replace(plan, requests=halved))
    assert check is not None and not check.ok
    assert check.mismatched == 8
    assert check.served_tokens == 8 * 125 and check.planned_tokens == 8 * 65
    assert "differ by more than 1%" in check.message
    assert "'words'" in check.message  # the plan's token space is named


def _model_tokenizer(directory: Path) -> Path:
    """A byte-level BPE tokenizer.json trained here, as a model directory ships one."""
    words = ["alpha", "bravo", "charlie", "delta", "echo"]
    words += ["foxtrot", "golf", "hotel", "india", "juliet"]
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 50
    tokenizer.train_from_iterator(corpus, trainer)
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.mark.timeout(150)
def test_a_study_on_the_simulator_counts_in_the_served_models_tokenizer(tmp_path: Path) -> None:
    model = _model_tokenizer(tmp_path / "model")
    workload = tmp_path / "chat.jsonl"
    small = chat(ChatParams(requests=12, prompt_tokens_median=150, output_tokens_median=8))
    write_workload(workload, [small.header, *small.requests])
    argv = autotune_argv(
        "try", "--workload", str(workload), "--model", "qwen3.6-27b-awq",
        "--hardware", "rtx4080s-32g", "--mode", "concurrency", "--json",
        *tuner_args(tmp_path, {"simulator": {"time_scale": 50},
                               "engine": {"tokenizer": str(model)}}),
    )  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    replay = json.loads(done.stdout)["replay"]
    check = replay["prompt_tokens_check"]
    assert check["token_space"] == "model" and check["mismatched"] == 0, check
    assert check["served_tokens"] == check["planned_tokens"]
    planned = sum(r.input.messages[0].content[0].tokens for r in small.requests)
    template = check["template_tokens"] // check["checked"]
    assert replay["total_input_tokens"] == planned + template * 12
