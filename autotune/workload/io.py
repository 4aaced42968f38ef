"""Reading and writing workload files: parse, validate references, write atomically."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pydantic import TypeAdapter, ValidationError

from autotune.errors import InputError, WorkloadError
from autotune.workload.jsonline import parse_json_line
from autotune.workload.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Header,
    PrefixRecord,
    Record,
    RequestRecord,
)

_RECORD = TypeAdapter(Record)


@dataclass
class Workload:
    """A parsed workload file: header, prefixes by id, requests in file order."""

    header: Header
    prefixes: dict[str, PrefixRecord]
    requests: list[RequestRecord]
    digest: str = ""  # sha256 of the file bytes ("" when built in memory)
    skipped: list[str] = field(default_factory=list)  # "LINE: reason" of dropped lines
    path: Path | None = None  # the file it was read from (None when built in memory)
    request_lines: dict[str, int] = field(default_factory=dict)  # request id -> line number

    def where(self, request_id: str) -> str:
        """``FILE:LINE`` of a request read from a file, else ``request 'ID'``."""
        line = self.request_lines.get(request_id)
        if self.path is None or line is None:
            return f"request {request_id!r}"
        return f"{self.path}:{line}"

    def records(self) -> list[Header | PrefixRecord | RequestRecord]:
        """Header, then each prefix just before its first use, then requests."""
        out: list[Header | PrefixRecord | RequestRecord] = [self.header]
        emitted: set[str] = set()
        for request in self.requests:
            if request.prefix is not None and request.prefix not in emitted:
                out.append(self.prefixes[request.prefix])
                emitted.add(request.prefix)
            out.append(request)
        return out


_RECORD_TAGS = {"header", "prefix", "request"}
_INPUT_TAGS = {"delta", "full", "blocks"}
# What a value that is there fails as when it is tried against the union member it is not
# (a synthetic part against TextPart): the error worth showing is another one.
_UNION_MISMATCH = {"missing", "extra_forbidden", "string_type", "list_type", "model_type"}


def _field_error(exc: ValidationError) -> str:
    """``field.path: message`` of the error that explains the line, without discriminator
    tags or union members (``str``, ``list[...]``, ``SynthPart``) in the path."""
    errors = exc.errors()
    first = next((e for e in errors if e["type"] not in _UNION_MISMATCH), errors[0])
    parts = [str(part) for part in first["loc"]]
    if parts and parts[0] in _RECORD_TAGS:
        parts = parts[1:]
    if len(parts) > 1 and parts[0] == "input" and parts[1] in _INPUT_TAGS:
        del parts[1]
    parts = [p for p in parts if p != "str" and not p.startswith("list[") and not p[0].isupper()]
    message = first["msg"].removeprefix("Value error, ")  # our validators' own words
    return f"{'.'.join(parts) or '(root)'}: {message}"


def _check_header(header: Header, where: str) -> None:
    if header.version != FORMAT_VERSION:
        raise WorkloadError(
            f"{where}: version: unsupported {FORMAT_NAME} version {header.version} "
            f"(this autotune reads version {FORMAT_VERSION})"
        )


def read_workload(path: Path, *, skip_invalid: bool = False) -> Workload:
    """Parse and validate a workload file.

    Raises WorkloadError("FILE:LINE: field: message"). With ``skip_invalid``,
    bad request/prefix lines (and requests depending on them) are dropped and
    listed in ``Workload.skipped``; a bad header is always an error.
    """
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read workload: {exc.strerror}") from exc
    with handle:
        return _read_lines(path, handle, skip_invalid)


def _read_lines(path: Path, handle: BinaryIO, skip_invalid: bool) -> Workload:
    """One line at a time: the file is never held whole, only the records parsed from it."""
    digest = hashlib.sha256()
    header: Header | None = None
    prefixes: dict[str, PrefixRecord] = {}
    requests: dict[str, RequestRecord] = {}
    request_lines: dict[str, int] = {}
    skipped: list[str] = []
    for number, line in enumerate(handle, 1):
        digest.update(line)
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = _parse_line(line, where)
            if header is None:
                if not isinstance(record, Header):
                    raise WorkloadError(f"{where}: type: the first line must be the header")
                _check_header(record, where)
                header = record
            elif isinstance(record, Header):
                raise WorkloadError(f"{where}: type: a second header")
            elif isinstance(record, PrefixRecord):
                if record.id in prefixes:
                    raise WorkloadError(f"{where}: id: duplicate prefix id {record.id!r}")
                prefixes[record.id] = record
            else:
                _check_references(record, where, prefixes, requests)
                requests[record.id] = record
                request_lines[record.id] = number
        except WorkloadError as exc:
            if header is None:
                foreign = _foreign_trace(path, where)
                if foreign is not None:
                    raise foreign from exc
                raise
            if not skip_invalid:
                raise
            skipped.append(f"{number}: {str(exc).removeprefix(where + ': ')}")
    if header is None:
        raise WorkloadError(f"{path}:1: header: empty workload file")
    return Workload(
        header,
        prefixes,
        list(requests.values()),
        digest.hexdigest(),
        skipped,
        path=path,
        request_lines=request_lines,
    )


def _foreign_trace(path: Path, where: str) -> WorkloadError | None:
    """The error for a trace that ``workload import`` reads (a Weka / cc-traces file, say)
    given where a workload belongs; None when it is no format autotune knows."""
    from autotune.workload.importers.detect import detect_source  # importers write workloads

    try:
        kind = detect_source(path)
    except InputError:
        return None
    return WorkloadError(
        f"{where}: type: a {kind} trace, not an autotune workload; convert it first: "
        f"autotune workload import {path} OUT.jsonl"
    )


def _parse_line(line: bytes, where: str) -> Header | PrefixRecord | RequestRecord:
    obj = parse_json_line(line, where)
    if isinstance(obj, dict) and obj.get("type") == "header" and "version" in obj:
        version = obj["version"]
        if isinstance(version, int) and version != FORMAT_VERSION:
            raise WorkloadError(
                f"{where}: version: unsupported {FORMAT_NAME} version {version} "
                f"(this autotune reads version {FORMAT_VERSION})"
            )
    try:
        return _RECORD.validate_python(obj)
    except ValidationError as exc:
        raise WorkloadError(f"{where}: {_field_error(exc)}") from exc


def _check_references(
    request: RequestRecord,
    where: str,
    prefixes: dict[str, PrefixRecord],
    requests: dict[str, RequestRecord],
) -> None:
    if request.id in requests:
        raise WorkloadError(f"{where}: id: duplicate request id {request.id!r}")
    if request.prefix is not None and request.prefix not in prefixes:
        raise WorkloadError(f"{where}: prefix: unknown prefix {request.prefix!r} (define it above)")
    if request.parent is not None:
        parent = requests.get(request.parent)
        if parent is None:
            raise WorkloadError(
                f"{where}: parent: unknown request {request.parent!r} (define it above)"
            )
        if parent.session != request.session:
            raise WorkloadError(f"{where}: parent: {request.parent!r} is in another session")
    for dep in request.dependencies():
        if dep not in requests:
            raise WorkloadError(f"{where}: after: unknown request {dep!r} (define it above)")


def write_workload(path: Path, records: Iterable[Header | PrefixRecord | RequestRecord]) -> int:
    """Write records as JSONL atomically (temp file + os.replace); returns bytes written."""
    lines = [
        record.model_dump_json(exclude_none=True, exclude_defaults=False) for record in records
    ]
    payload = ("\n".join(lines) + "\n").encode()
    write_atomic(path, payload)
    return len(payload)


def write_atomic(path: Path, payload: bytes) -> None:
    """Write bytes to ``path`` through a temp file in the same directory, mode 0600
    whatever the umask (workloads hold users' prompts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)  # mkstemp's mode already; said here so it stays so
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
