"""vLLM's human-readable integers: ``9G`` (binary), ``9g`` (decimal), ``25.6k``.

The same rules as vLLM's ``human_readable_int`` (vllm/utils/argparse_utils.py):
lowercase k/m/g/t are powers of 10, uppercase K/M/G/T powers of 2, and a
fractional number is allowed only with a decimal (lowercase) suffix.
"""

from __future__ import annotations

import re

from autotune.errors import InputError

GIB = 1 << 30
MIB = 1 << 20

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)\s*$")


def parse_human_int(text: str | int, *, field: str = "value") -> int:
    """Parse ``text`` as vLLM does; ``field`` names the flag in the error.

    Raises InputError on anything vLLM would reject.
    """
    if isinstance(text, int):
        return text
    match = _PATTERN.match(text)
    if match is None:
        raise InputError(
            f"{field}: not a number with an optional k/m/g/t or K/M/G/T suffix: {text!r}"
        )
    number, suffix = match.groups()
    if not suffix:
        if "." in number:
            raise InputError(f"{field}: must be an integer, but got {text!r}")
        return int(number)
    if suffix in _BINARY:
        if "." in number:
            raise InputError(
                f"{field}: a fraction needs a decimal (lowercase) suffix, but got {text!r}"
            )
        return int(number) * _BINARY[suffix]
    return int(float(number) * _DECIMAL[suffix])


def gib(num_bytes: float) -> float:
    """Bytes as GiB (vLLM's log unit)."""
    return num_bytes / GIB
