"""Deterministic synthetic text, token-exact in the plan's tokenizer.

Text is drawn from a vocabulary whose entries are one token each and
concatenate without merging. For ``WordTokenizer`` (the simulator's
tokenizer and the documented approximation) that is a fixed list of
pseudo-words joined by spaces; for a served model's tokenizer
(``HfTokenizer``) it is its single-token `` word`` pieces, concatenated.
A block of hash id ``h`` in scope ``s`` is seeded by ``(seed, s, h)``:
identical ids give identical text, so the server's prefix cache sees
exactly the sharing the trace had. A shorter (partial) block of the same id
is a prefix of the full block.
"""

from __future__ import annotations

import hashlib
import itertools
from array import array

from autotune.errors import WorkloadError
from autotune.workload.hf_tokenizer import HfTokenizer
from autotune.workload.tokenizer import Tokenizer, WordTokenizer

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u")


def word_vocabulary() -> list[str]:
    """14,700 pseudo-words: two syllables and an optional final n or s (``bakun``, ...)."""
    syllables = [onset + vowel for onset in _ONSETS for vowel in _VOWELS]
    return [a + b + c for a, b in itertools.product(syllables, repeat=2) for c in ("n", "s", "")]


class Synthesizer:
    """Builds synthetic text for a tokenizer, deterministically from string keys."""

    def __init__(self, tokenizer: Tokenizer, *, seed: int = 0, block_size: int = 64) -> None:
        if isinstance(tokenizer, HfTokenizer):
            self._vocab, self._separator = tokenizer.synthetic_vocabulary(), ""
        elif isinstance(tokenizer, WordTokenizer):
            self._vocab, self._separator = word_vocabulary(), " "
        else:
            raise WorkloadError(
                f"tokenizer {tokenizer.name!r}: synthetic text needs a WordTokenizer or an "
                "HfTokenizer (autotune.workload.load_tokenizer)"
            )
        self.tokenizer = tokenizer
        self.seed = seed
        self.block_size = block_size

    def join(self, words: list[str]) -> str:
        """Text of exactly ``len(words)`` tokens."""
        return self._separator.join(words)

    def words(self, key: str, tokens: int) -> list[str]:
        """``tokens`` vocabulary entries drawn from the SHAKE-256 stream of ``key``."""
        stream = hashlib.shake_256(f"{self.seed}:{key}".encode()).digest(4 * tokens)
        vocab, size = self._vocab, len(self._vocab)
        return [vocab[index % size] for index in array("I", stream)]

    def text(self, key: str, tokens: int) -> str:
        """Unique text of exactly ``tokens`` tokens, seeded by ``key``."""
        return self.join(self.words(key, tokens))

    def block_words(self, scope: str, hash_id: int, tokens: int) -> list[str]:
        """The first ``tokens`` words of the block of ``hash_id`` in ``scope``."""
        if tokens > self.block_size:
            raise WorkloadError(f"block of {tokens} tokens exceeds block_size {self.block_size}")
        return self.words(f"{scope}:{hash_id}", self.block_size)[:tokens]

    def blocks_text(self, scope: str, hash_ids: list[int], tokens: int, tail_key: str) -> str:
        """``tokens`` tokens: full blocks of ``hash_ids``; the last block partial or, past
        the hashed blocks, a unique tail seeded by ``tail_key``."""
        size = self.block_size
        hashed = min(tokens, size * len(hash_ids))
        if hashed <= size * (len(hash_ids) - 1):
            raise WorkloadError(
                f"{len(hash_ids)} hash ids of {size} tokens need more than "
                f"{size * (len(hash_ids) - 1)} tokens, but got tokens={tokens}"
            )
        words: list[str] = []
        for index, hash_id in enumerate(hash_ids):
            words.extend(self.block_words(scope, hash_id, min(size, hashed - index * size)))
        if tokens > hashed:
            words.extend(self.words(tail_key, tokens - hashed))
        return self.join(words)

    def count(self, text: str) -> int:
        return self.tokenizer.count(text)
