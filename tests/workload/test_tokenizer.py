"""The word approximation: synthetic words are one token each, other text is counted like BPE."""

from __future__ import annotations

import base64
import json
import random

from autotune.workload.synth import word_vocabulary
from autotune.workload.tokenizer import WordTokenizer, expected_tokens


def test_every_synthetic_word_is_exactly_one_token_where_it_stands() -> None:
    words = word_vocabulary()
    tokenizer = WordTokenizer()
    assert tokenizer.count(" ".join(words)) == len(words)
    assert all(tokenizer.count(word) == 1 for word in words[::97])


def test_text_with_few_spaces_is_counted_like_a_bpe_tokenizer() -> None:
    tokenizer = WordTokenizer()
    tool_result = json.dumps({"path": "/src/app/main.py", "lines": [120, 4096], "ok": True})
    code = "def load_tokenizer(path_or_name: str) -> HfTokenizer | None:\n    return None\n"
    cjk = "大型语言模型的推理服务需要在显存、延迟和吞吐量之间取得平衡。"
    blob = base64.b64encode(random.Random(0).randbytes(300)).decode()
    # Whitespace splitting says 7, 9, 1 and 1; a real tokenizer (Tekken) 28, 21, 32 and 305.
    assert 24 <= tokenizer.count(tool_result) <= 32
    assert 18 <= tokenizer.count(code) <= 24
    assert 20 <= tokenizer.count(cjk) <= 34
    assert 260 <= tokenizer.count(blob) <= 340


def test_ids_are_stable_and_shared_text_shares_a_prefix() -> None:
    first, second = WordTokenizer(), WordTokenizer()
    head = 'System prompt: {"tool": "Read"} and some words'
    assert first.encode(head) == second.encode(head)
    assert first.encode(head + " more text")[: len(first.encode(head))] == first.encode(head)
    assert first.encode("alpha") != first.encode("bravo")


def test_long_and_random_pieces_cost_more_than_one_token() -> None:
    assert expected_tokens(" internationalization") > 1.5
    assert expected_tokens("HTTPSCONNECTION") > 5
    assert expected_tokens("aGVsbG8gd29ybGQx") > 10  # base64: case flips every few letters
    assert expected_tokens(" the") == 1.0
