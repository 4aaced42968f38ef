"""Lines no JSON reader should choke on: a megabyte-long word loads in memory linear in
its length, and a 5,000-digit integer, 100,000 nested brackets or invalid UTF-8 is one
line naming file, line and field (exit 2), never a traceback or a silent U+FFFD; the
importers drop such lines of a request log and say so."""

from __future__ import annotations

import hashlib
import json
import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.workload.tokenizer import WordTokenizer
from tests.workload.conftest import HEADER

HEADER_LINE = json.dumps(HEADER).encode()
MEMORY_LIMIT_BYTES = 1 << 30  # the CLI's address space: numpy and the interpreter fit twice


def _request(content: bytes, output: bytes = b"8") -> bytes:
    return (
        b'{"type": "request", "id": "r", "input": {"mode": "full", "messages": '
        b'[{"role": "user", "content": ' + content + b'}]}, "output": {"tokens": ' + output + b"}}"
    )


def _stats(path: Path, *, limit_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-m", "autotune", "workload", "stats", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
    )


def _word_line(tmp_path: Path, letters: int) -> Path:
    """A workload whose one request is a single word of ``letters`` random-case letters
    (a base64 image or minified blob without its digits and signs: one tokenizer piece)."""
    rng = random.Random(7)
    word = "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", k=letters))
    path = tmp_path / "word.jsonl"
    path.write_bytes(HEADER_LINE + b"\n" + _request(json.dumps(word).encode()) + b"\n")
    return path


def test_a_one_megabyte_word_loads_under_a_one_gigabyte_limit(tmp_path: Path) -> None:
    """Before: one key per token, each holding the whole word: a MemoryError past 4 GB."""
    done = _stats(_word_line(tmp_path, 1_000_000), limit_bytes=MEMORY_LIMIT_BYTES)
    assert done.returncode == 0, done.stderr[-2000:]
    assert abs(json.loads(done.stdout)["input_tokens"]["max"] - 1e6 / 1.2) < 1  # random case


@pytest.mark.faults
def test_a_ten_megabyte_word_loads_under_a_one_gigabyte_limit(tmp_path: Path) -> None:
    """Before: 23.8 GB and the OOM killer. Now about 0.5 GB resident (docs/benchmarks.md)."""
    done = _stats(_word_line(tmp_path, 10_000_000), limit_bytes=MEMORY_LIMIT_BYTES)
    assert done.returncode == 0, done.stderr[-2000:]
    assert abs(json.loads(done.stdout)["input_tokens"]["max"] - 1e7 / 1.2) < 1


def test_a_long_piece_has_the_ids_a_short_one_would() -> None:
    """Long pieces skip the cache and hash incrementally: the ids must not move (the
    simulator's prefix cache and its pinned predictions see them)."""
    piece = "".join(random.Random(3).choices("abcdefghijklmnopqrstuvwxyzXYZ", k=700))
    tokenizer = WordTokenizer()
    ids = tokenizer.encode(piece)
    keys = [piece, *(f"{piece}\0{index}" for index in range(1, len(ids)))]
    digests = [hashlib.blake2b(key.encode(), digest_size=4).digest() for key in keys]
    assert ids == [int.from_bytes(d, "little") & (tokenizer.vocab_size - 1) for d in digests]
    assert tokenizer.count(piece) == len(ids) == WordTokenizer().count(piece)


BAD_LINES = {
    "a 5,000-digit integer": (
        _request(b'"hi"', output=b"9" * 5000),
        "output.tokens: an integer of 5,000 digits is past any bound",
    ),
    "100,000 nested brackets": (
        b"[" * 100_000 + b"]" * 100_000,
        "invalid JSON: nested too deeply",
    ),
    "invalid UTF-8 in a string": (
        _request(b'"caf\xc3\xa9, then \xff\xfe"'),
        "input.messages.0.content: invalid UTF-8: byte 0xff at character 12",
    ),
    "a lone surrogate escape": (
        _request(b'"a \\ud83d\\ude00 pair, then half of one: \\ud800"'),
        "input.messages.0.content: invalid string: a lone surrogate \\ud800 at character 29 "
        "(half of a pair; not a character)",
    ),
    "invalid UTF-8 outside a string": (
        b'{"type": "request", \xff "id": "r"}',
        "invalid UTF-8: byte 0xff at character 21",
    ),
}


@pytest.mark.parametrize(("line", "message"), BAD_LINES.values(), ids=list(BAD_LINES))
def test_an_unreadable_line_is_one_line_naming_file_line_and_field(
    tmp_path: Path, line: bytes, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(HEADER_LINE + b"\n" + line + b"\n")
    done = _stats(path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == f"error: {path}:2: {message}"


@pytest.mark.parametrize("source_format", ["openai-log", None])
def test_an_importer_drops_unreadable_lines_without_a_traceback(
    tmp_path: Path, source_format: str | None
) -> None:
    """Before: a RecursionError traceback, exit 1, from the import and from detection."""
    good = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    deep, digits = "[" * 100_000 + "]" * 100_000, '{"max_tokens": ' + "9" * 5000 + "}"
    source = tmp_path / "log.jsonl"
    lines = [good, deep, digits, good] if source_format else [good, digits, good]  # in its peek
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    named = ["--from", source_format] if source_format else []
    argv = [sys.executable, "-m", "autotune", "workload", "import", *named, str(source), str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    if source_format:
        assert done.returncode == 0 and "2 x invalid JSON line" in done.stdout + done.stderr
        assert out.exists()
    else:  # detection reads the first lines: junk there is no known format
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
