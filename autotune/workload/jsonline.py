"""One JSON line of a workload file to Python objects, whatever its bytes.

``json.loads`` alone lets three kinds of bad line through as a traceback or not at
all: an integer of thousands of digits (ValueError from ``int()``), brackets nested
past the recursion limit (RecursionError), and invalid UTF-8, which a lenient decode
turns silently into U+FFFD. Here each is a ``WorkloadError`` naming the field.
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
            raise WorkloadError(f"{where}: (line): {_bad_byte(escaped)}") from exc
        raise WorkloadError(f"{where}: (line): invalid JSON: {exc.msg}") from exc
    except RecursionError as exc:
        raise WorkloadError(f"{where}: (line): invalid JSON: nested too deeply") from exc
    if unreadable or bad_bytes:  # the walk costs a pass: only a line with a problem pays it
        raise WorkloadError(f"{where}: {_first_problem(obj, bad_bytes)}")
    return obj


def _bad_byte(escaped: re.Match[str]) -> str:
    byte = ord(escaped.group()) - 0xDC00
    return f"invalid UTF-8: byte 0x{byte:02x} at character {escaped.start() + 1:,}"


def _first_problem(obj: Any, bad_bytes: bool) -> str:
    """``field.path: message`` of the first unreadable value, in document order."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        shown = _ESCAPED_BYTE.sub("?", path) or "(root)"  # a bad byte in a key prints as ?
        if isinstance(value, _Unreadable):
            return f"{shown}: an integer of {value.digits:,} digits is past any bound"
        if isinstance(value, str) and bad_bytes:
            escaped = _ESCAPED_BYTE.search(value)
            if escaped is not None:
                return f"{shown}: {_bad_byte(escaped)}"
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
    raise AssertionError("a line with a problem has an unreadable value")
