"""Tokenizers for synthetic text: the served model's own, or the word approximation.

``WordTokenizer`` is the approximation used when no tokenizer for the served
model is available offline, and it is the simulator's tokenizer. Synthetic
text (pseudo-words of at most six lowercase letters joined by spaces) is one
token per word, so it is token-exact on the simulator; any other text (code,
JSON, CJK, base64) is counted the way a byte-level BPE tokenizer counts it:
split like a GPT/Qwen pre-tokenizer (letter runs with their leading space,
single digits, punctuation runs, whitespace) and each piece costs what such
pieces cost in a real vocabulary. The error against a real tokenizer is
measured by scripts/measure_token_counts.py (docs/replay.md).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Protocol


class Tokenizer(Protocol):
    """The little autotune needs from a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...


_LETTER = r"[^\W\d_]"
_PIECES = re.compile(  # Qwen2's pre-tokenizer (as GPT-4's, but digits one by one)
    r"'(?i:[sdmt]|ll|ve|re)"  # English contractions
    rf"|(?:[^\r\n\w]|_)?{_LETTER}+"  # a letter run and the one space or symbol before it
    r"|\d"  # digits one by one
    r"| ?(?:[^\s\w]|_)+[\r\n]*"  # punctuation runs
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"  # line breaks, indentation, spaces
)
_SUBWORDS = re.compile(r"[^A-Za-z]?[A-Z]?[a-z]+|[^A-Za-z]?[A-Z]+(?![a-z])")  # camelCase, ACRONYMS
# Expected tokens per piece, fitted on Mistral's Tekken over this repository's code and docs
# (scripts/measure_token_counts.py); a fractional part is rounded up for a stable pseudo-random
# share of the pieces of that shape, so totals come out right on average.
_CJK_CHARS_PER_TOKEN = 1.3  # common 2-character words are one token
_LETTERS_PER_TOKEN = 3.0  # non-ASCII letters beyond CJK
_RANDOM_LETTERS_PER_TOKEN = 1.2  # base64, hashes: case flips every ~2 letters
# Pieces up to this long keep their ids for reuse; a longer one (a base64 image, a minified
# blob) is hashed afresh each time, so the cache never holds more than a few KB per piece.
_CACHED_PIECE_CHARS = 256


def _subword_tokens(word: str) -> float:
    letters = word.lstrip()
    n = len(letters)
    if letters.islower():
        if n <= 6:  # the synthetic words of the word approximation are exactly one
            return 1.0 if word[0] in " " + letters[0] else 1.2
        if not word[0].isalpha():  # after a space or symbol
            return 1.0 + min(0.3 * (n - 6), 0.7)
        return 1.0 + min(0.35 * (n - 6), 1.2) + 0.15 * max(0, n - 13)
    if letters.isupper():
        return max(1.0, 0.42 * n)
    return 1.05 if n <= 5 else 1.0 + 0.15 * (n - 5)


def _letters_tokens(piece: str) -> float:
    words = 0
    tokens = 0.0  # summed in order, as sum() would: the same float for any piece
    for match in _SUBWORDS.finditer(piece):  # one word at a time: a 10 MB run is no list
        words += 1
        tokens += _subword_tokens(match.group())
    letters = len(piece.lstrip())
    if words >= 3 and letters < 3 * words:
        return letters / _RANDOM_LETTERS_PER_TOKEN
    return tokens


def expected_tokens(piece: str) -> float:
    """Tokens a real BPE vocabulary spends on one pre-tokenizer piece, on average."""
    last = piece[-1]
    if last.isascii() and last.isalpha():  # an ASCII letter run
        return _letters_tokens(piece)
    if last.isdigit() or piece.isspace():
        return 1.0
    if "\u3040" <= last <= "\ud7af" or "\uff00" <= last <= "\uffef":
        return max(1.0, len(piece) / _CJK_CHARS_PER_TOKEN)
    if last.isalpha():
        return max(1.0, len(piece.lstrip()) / _LETTERS_PER_TOKEN)
    n = len(piece.lstrip())
    return 1.0 if n <= 2 else 0.6 * (n - 1) + 0.2


def _digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "little")


def piece_cost(piece: str) -> int:
    """Whole tokens for ``piece``: its expected count, the fraction rounded by a stable hash."""
    expected = expected_tokens(piece)
    whole = int(expected)
    fraction = expected - whole
    if fraction and _digest(f"\1{piece}") / 2**32 < fraction:
        whole += 1
    return whole


def _ids(piece: str, count: int, modulus: int) -> Iterator[int]:
    """Ids of the ``count`` tokens of ``piece``: the digest of ``piece``, then of
    ``piece\\0N`` for the N-th, hashed from one copy of the piece's hash state so a long
    piece costs its length once, not once per token."""
    head = hashlib.blake2b(piece.encode(), digest_size=4)
    yield int.from_bytes(head.digest(), "little") & (modulus - 1)
    for index in range(1, count):
        key = head.copy()
        key.update(b"\0%d" % index)
        yield int.from_bytes(key.digest(), "little") & (modulus - 1)


class WordTokenizer:
    """The word approximation: a synthetic word is one token, other text is counted like BPE.

    Ids are stable hashes of each piece (and of its n-th token), so identical text
    gives identical ids and the simulator's prefix cache sees real sharing.
    """

    name = "words"
    vocab_size = 1 << 31

    def __init__(self) -> None:
        self._pieces: dict[str, tuple[int, ...]] = {}

    def piece_ids(self, piece: str) -> tuple[int, ...]:
        ids = self._pieces.get(piece)
        if ids is None:
            ids = tuple(_ids(piece, piece_cost(piece), self.vocab_size))
            if len(piece) <= _CACHED_PIECE_CHARS:
                self._pieces[piece] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for match in _PIECES.finditer(text):
            piece = match.group()
            if len(piece) <= _CACHED_PIECE_CHARS:
                out.extend(self.piece_ids(piece))
            else:
                out.extend(_ids(piece, piece_cost(piece), self.vocab_size))
        return out

    def count(self, text: str) -> int:
        return sum(self._piece_count(match.group()) for match in _PIECES.finditer(text))

    def _piece_count(self, piece: str) -> int:
        if len(piece) <= _CACHED_PIECE_CHARS:
            return len(self.piece_ids(piece))
        return piece_cost(piece)
