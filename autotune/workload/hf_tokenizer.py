"""A served model's own tokenizer, when one is available offline.

``load_tokenizer`` finds a ``tokenizer.json`` (a file, a model directory, or a
model name in the local Hugging Face cache) and returns an ``HfTokenizer``;
it returns None when nothing is found, and callers fall back to the word
approximation (and say so).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import tokenizers

from autotune.errors import WorkloadError

MIN_VOCABULARY = 8  # fewer round-trip-safe words than this cannot make varied text
_WORD = re.compile(r" [a-z]{2,12}")


class HfTokenizer:
    """A ``tokenizers.Tokenizer`` behind autotune's Tokenizer protocol."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, name: str) -> None:
        self._tokenizer = tokenizer
        self.name = name
        self._vocabulary: list[str] | None = None

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def synthetic_vocabulary(self) -> list[str]:
        """Single-token words (`` word``) that re-encode to themselves alone and doubled,
        so any concatenation has exactly one token per entry."""
        if self._vocabulary is None:
            words = []
            for token_id in range(self._tokenizer.get_vocab_size()):
                text = self._tokenizer.decode([token_id])
                if _WORD.fullmatch(text) and self.encode(text + text) == [token_id, token_id]:
                    words.append(text)
            if len(words) < MIN_VOCABULARY:
                raise WorkloadError(
                    f"tokenizer {self.name!r}: only {len(words)} round-trip-safe words; "
                    f"need >= {MIN_VOCABULARY} for synthetic text"
                )
            self._vocabulary = words
        return self._vocabulary


def _hub_snapshot(name: str) -> Path | None:
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub"))
    snapshots = hub / f"models--{name.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/tokenizer.json")) if snapshots.is_dir() else []
    return found[-1] if found else None


def load_tokenizer(path_or_name: str | Path) -> HfTokenizer | None:
    """The tokenizer at a path (file or model directory) or of a cached model name."""
    path = Path(path_or_name)
    candidate = path / "tokenizer.json" if path.is_dir() else path
    if not candidate.is_file():
        candidate = _hub_snapshot(str(path_or_name))
        if candidate is None:
            return None
    try:
        loaded = tokenizers.Tokenizer.from_file(str(candidate))
    except Exception as exc:  # the Rust library raises plain Exception on a bad file
        raise WorkloadError(f"{candidate}: cannot load tokenizer: {exc}") from exc
    name = path.name if path.is_dir() else str(path_or_name)
    return HfTokenizer(loaded, name)
