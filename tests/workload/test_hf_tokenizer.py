from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.workload import load_plan, load_tokenizer
from tests.workload.conftest import HEADER

tokenizers = pytest.importorskip("tokenizers", reason="the optional `tokenizers` package")

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
