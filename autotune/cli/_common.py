"""What every command shares: error reporting, the storage and study options."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Annotated, ParamSpec, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from autotune.errors import AutotuneError, InputError, StorageError
from autotune.redaction import redact
from autotune.replay.load import LoadSpec

LOAD_DEFAULTS = LoadSpec()  # the load options of run, try and replay default to LoadSpec's
MAX_GAP_DEFAULT = f"{LOAD_DEFAULTS.max_gap_s:g}s"

P = ParamSpec("P")
R = TypeVar("R")


def _storage_url(text: str) -> str:
    """``--storage``'s value as a URL (a plain path is a SQLite file); bad input is one line."""
    from autotune.study.storage import storage_url_of  # the study: Optuna, pandas, SQLAlchemy

    try:
        return storage_url_of(text)
    except StorageError as exc:
        error_console().print(
            f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None


StorageOption = Annotated[
    str,
    typer.Option(
        "--storage",
        envvar="AUTOTUNE_STORAGE",
        callback=_storage_url,
        help="Study storage: a SQLAlchemy URL (sqlite:///PATH, postgresql://USER@HOST/DB) or "
        "a plain path of a SQLite file.",
    ),
]
StudyOption = Annotated[
    str | None,
    typer.Option("--study", help="Study name (default: the only or most recent study)."),
]


FILE_WIDTH = 250  # columns of a table printed into a file or a pipe (not a terminal)


def console() -> Console:
    """The console commands print to (stdout). Into a file or a pipe rich would assume 80
    columns and cut a table's cells ("h100-…"); there it gets ``FILE_WIDTH`` unless
    ``COLUMNS`` says otherwise."""
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Console()
    return Console(width=FILE_WIDTH)


def error_console() -> Console:
    return Console(stderr=True)


def format_validation_error(exc: ValidationError, *, where: str | None = None) -> str:
    """One line naming the first failing field: ``where: field.path: message``."""
    first = exc.errors()[0]
    path = ".".join(str(part) for part in first["loc"]) or "(root)"
    prefix = f"{where}: " if where else ""
    return f"{prefix}{path}: {first['msg']}"


def option_error(exc: ValidationError) -> InputError:
    """A command's options model refused a value: one line naming the option as typed
    (``--trials 0: ...``), not the model's field (``trials``)."""
    first = exc.errors()[0]
    names = [str(part) for part in first["loc"] if isinstance(part, str)]
    if names[:1] == ["load"]:  # --mode, --concurrency, --duration fill the load
        names = names[1:]
    if not names:
        return InputError(format_validation_error(exc))
    flag = "--" + _OPTION_OF_FIELD.get(names[0], names[0].removesuffix("_s").replace("_", "-"))
    return InputError(f"{flag} {first.get('input')!r}: {first['msg']}")


_OPTION_OF_FIELD = {"slos": "slo"}  # fields not named as their option


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn our errors into one red line on stderr and exit code 2.

    ``AUTOTUNE_DEBUG=1`` re-raises for a traceback.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (AutotuneError, ValidationError) as exc:
            if os.environ.get("AUTOTUNE_DEBUG"):
                raise
            message = format_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
            line = f"[red]error:[/red] {escape(redact(message))}"  # a message's [brackets] are text
            error_console().print(line, highlight=False, soft_wrap=True)
            sys.exit(2)

    return wrapper


_DURATION = re.compile(r"^(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|h|d)?$")
_DURATION_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str | None, *, option: str) -> float | None:
    """``"8h"``, ``"30m"``, ``"90s"``, ``"250ms"`` or plain seconds -> seconds (None stays None)."""
    if text is None:
        return None
    match = _DURATION.match(text.strip())
    if match is None:
        raise InputError(f"{option} {text!r}: expected a duration such as 90s, 30m or 8h")
    return float(match["value"]) * _DURATION_S[match["unit"]]
