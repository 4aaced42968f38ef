"""One JSON line of a workload file to Python objects, whatever its bytes.

``json.loads`` alone lets three kinds of bad line through as a traceback or not at
all: an integer of thousands of digits (ValueError from ``int()``), brackets nested
past the recursion limit (RecursionError), and invalid UTF-8, which a lenient decode
turns silently into U+FFFD; and a ``\\ud800`` escape without its other half parses to a
string no encoder takes (a UnicodeEncodeError later). Here each is a ``WorkloadError``
naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

from autotune.errors import WorkloadError

# An integer with more digits than this is past every bound in the format (counts stop at
# 10 million): it is named without being converted (``int()`` of 5,000 digits raises).
MAX_INT_DIGITS = 100
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # an undecodable byte, kept by surrogateescape
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a parsed string: a lone half of a pair
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a line that may hold one


class _Unreadable:
    """Stands in, while a line is parsed, for an integer too long to convert."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def parse_json_line(line: bytes, where: str) -> Any:
    """The JSON value of one line. Raises WorkloadError("WHERE: field: message")."""
    try:
        text, bad_bytes = line.decode("utf-8"), False
    except UnicodeDecodeError:
        text, bad_bytes = line.decode("utf-8", errors="surrogateescape"), True
    unreadable: list[_Unreadable] = []

    def parse_int(digits: str) -> int | _Unreadable:
        if len(digits.lstrip("-")) <= MAX_INT_DIGITS:
            return int(digits)
        unreadable.append(_Unreadable(len(digits.lstrip("-"))))
        return unreadable[-1]

    try:
        obj = json.loads(text, parse_int=parse_int)
    except json.JSONDecodeError as exc:
        escaped = _ESCAPED_BYTE.search(text) if bad_bytes else None
        if escaped is not None:  # a bad byte outside any string
            raise WorkloadError(f"{where}: {_bad_byte(escaped)}") from exc
        raise WorkloadError(f"{where}: invalid JSON at column {exc.colno}: {exc.msg}") from exc
    except RecursionError as exc:
        raise WorkloadError(f"{where}: invalid JSON: nested too deeply") from exc
    # The walk costs a pass over the value: only a line that may have a problem pays it.
    strings = bad_bytes or _SURROGATE_ESCAPE.search(line) is not None
    if unreadable or strings:
        problem = _first_problem(obj, strings=strings, bad_bytes=bad_bytes)
        if problem is not None:  # None: the escapes were whole pairs (an emoji)
            raise WorkloadError(f"{where}: {problem}")
    return obj


def _bad_byte(escaped: re.Match[str]) -> str:
    byte = ord(escaped.group()) - 0xDC00
    return f"invalid UTF-8: byte 0x{byte:02x} at character {escaped.start() + 1:,}"


def _bad_string(found: re.Match[str], bad_bytes: bool) -> str:
    if bad_bytes and _ESCAPED_BYTE.fullmatch(found.group()):
        return _bad_byte(found)
    return (
        f"invalid string: a lone surrogate \\u{ord(found.group()):04x} at character "
        f"{found.start() + 1:,} (half of a pair; not a character)"
    )


def _first_problem(obj: Any, *, strings: bool, bad_bytes: bool) -> str | None:
    """``field.path: message`` of the first unreadable value, in document order."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        shown = _SURROGATE.sub("?", path) or "(root)"  # a bad byte in a key prints as ?
        if isinstance(value, _Unreadable):
            return f"{shown}: an integer of {value.digits:,} digits is past any bound"
        if isinstance(value, str) and strings:
            found = _SURROGATE.search(value)
            if found is not None:
                return f"{shown}: {_bad_string(found, bad_bytes)}"
        elif isinstance(value, dict):
            children = []
            for key, child in value.items():
                child_path = f"{path}.{key}" if path else str(key)
                children.append((child_path, key))
                children.append((child_path, child))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            items = [(f"{path}.{i}" if path else str(i), child) for i, child in enumerate(value)]
            stack.extend(reversed(items))
    return None
