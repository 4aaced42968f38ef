"""Tokenizers for synthetic text: the served model's own, or the word approximation.

``WordTokenizer`` is the documented approximation used when no tokenizer for
the served model is available offline, and it is the simulator's tokenizer:
one token per whitespace-separated word. Synthetic text built from it is
token-exact on the simulator.
"""

from __future__ import annotations

import hashlib
from typing import Protocol


class Tokenizer(Protocol):
    """The little autotune needs from a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...


class WordTokenizer:
    """One token per whitespace-separated word; ids are stable hashes of the word."""

    name = "words"
    vocab_size = 1 << 31

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        out: list[int] = []
        for word in text.split():
            token_id = ids.get(word)
            if token_id is None:
                digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
                token_id = int.from_bytes(digest, "little") & (self.vocab_size - 1)
                ids[word] = token_id
            out.append(token_id)
        return out

    def count(self, text: str) -> int:
        return len(text.split())
