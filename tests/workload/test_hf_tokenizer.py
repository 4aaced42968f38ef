from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import tokenizers

from autotune.workload import load_plan, load_tokenizer
from autotune.workload.gen import ChatParams, chat
from autotune.workload.io import write_workload
from autotune.workload.served import plan_for_model, requests_over
from tests.workload.conftest import HEADER

WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A byte-level BPE tokenizer.json trained here (as a served model would ship one)."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 50
    tokenizer.train_from_iterator(corpus, trainer)
    directory = tmp_path / "tiny-model"
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def test_synthetic_text_is_token_exact_in_the_model_tokenizer(
    model_dir: Path, write_jsonl: Callable[..., Path]
) -> None:
    tokenizer = load_tokenizer(model_dir)
    assert tokenizer is not None and tokenizer.name == "tiny-model"
    path = write_jsonl(
        [
            {**HEADER, "block_size": 8, "hash_scope": "global"},
            {"type": "prefix", "id": "p", "system": [{"tokens": 40}]},
            {"type": "request", "id": "a", "session": "s", "prefix": "p",
             "input": {"mode": "full", "messages": [{"role": "user", "content": [
                 {"tokens": 20, "hash_ids": [1, 2, 3]}, {"text": "alpha bravo"}]}]},
             "output": {"tokens": 7}},
            {"type": "request", "id": "b", "session": "s", "parent": "a",
             "input": {"mode": "delta", "append": [{"role": "user", "content": [{"tokens": 9}]}]},
             "output": {"tokens": 3}},
        ]
    )  # fmt: skip
    plan = load_plan(path, tokenizer=tokenizer)
    assert plan.token_space == "tiny-model"
    a, b = plan.requests
    for request in (a, b):
        rendered = tokenizer.count(request.system or "") + sum(
            tokenizer.count(m.text) for m in request.messages
        )
        assert rendered == request.prompt_tokens
    assert tokenizer.count(a.system or "") == 40
    assert tokenizer.count(b.messages[1].text) == 7  # a's response, exactly output.tokens
    assert a.prompt_tokens == 40 + 20 + tokenizer.count("\nalpha bravo")


def test_load_tokenizer_finds_nothing_offline(tmp_path: Path) -> None:
    assert load_tokenizer(tmp_path / "missing") is None
    assert load_tokenizer("no-such-org/no-such-model") is None


def test_a_served_model_plan_is_exact_in_its_tokenizer_or_says_why_not(
    model_dir: Path, tmp_path: Path
) -> None:
    workload = chat(ChatParams(requests=20, prompt_tokens_median=50, output_tokens_median=8))
    path = tmp_path / "chat.jsonl"
    write_workload(path, [workload.header, *workload.requests])
    served = plan_for_model(path, model=str(model_dir))
    assert served.note is None and served.plan.token_space == "tiny-model"
    assert served.tokenizer is not None
    for request in served.plan.requests:
        assert served.tokenizer.count(request.messages[0].text) == request.prompt_tokens
    missing = plan_for_model(path, model=str(tmp_path / "no-model"))
    assert missing.tokenizer is None and missing.plan.token_space == "words"
    assert missing.note is not None and "no tokenizer" in missing.note
    # Pre-flight: prompt after tokenisation + ChatML template estimate + output.
    longest = max(r.prompt_tokens + 8 + r.output_tokens for r in served.plan.requests)
    assert requests_over(served.plan, longest) == []
    over = requests_over(served.plan, longest - 1)
    assert [total for _, total in over] == [longest]
