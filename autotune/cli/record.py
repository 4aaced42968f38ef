"""`autotune record`: a recording reverse proxy that writes a workload file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.cli._common import console, handle_errors
from autotune.errors import InputError


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--listen: expected HOST:PORT, but got {value!r}")
    return host, int(port)


def _tell(notice: str) -> None:
    console().print(notice, highlight=False, soft_wrap=True, markup=False)


@handle_errors
def record(
    upstream: Annotated[str, typer.Option(help="Server to forward to, e.g. http://localhost:8000")],
    out: Annotated[Path, typer.Option(help="Workload file to write (JSONL).")],
    listen: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1:8090",
    anonymize: Annotated[
        bool, typer.Option(help="Keep token counts and prefix structure, drop all text.")
    ] = False,
) -> None:
    """Proxy OpenAI / Anthropic traffic to UPSTREAM and record it as a workload.

    Point Claude Code at it with ANTHROPIC_BASE_URL=http://HOST:PORT and
    ANTHROPIC_MODEL=<the server's served model name>, and set
    CLAUDE_CODE_ATTRIBUTION_HEADER=0 so its prefixes stay cacheable.
    """
    if not upstream.startswith(("http://", "https://")):
        raise InputError(f"--upstream: expected an http(s) URL, but got {upstream!r}")
    host, port = _listen(listen)
    console().print(
        f"recording {upstream} on http://{host}:{port} -> {out} "
        f"(ANTHROPIC_BASE_URL=http://{host}:{port}; Ctrl-C to stop)",
        highlight=False,
        soft_wrap=True,
    )
    from autotune.workload.proxy import serve  # uvicorn: this command only

    recorder = serve(upstream, host, port, out, anonymize=anonymize, notify=_tell)
    console().print(
        f"recorded {recorder.recorded} calls to {out} ({recorder.skipped} not recorded: "
        "errors or interrupted streams)",
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add `autotune record` to the root app."""
    app.command("record")(record)
