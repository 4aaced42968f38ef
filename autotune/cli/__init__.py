"""The `autotune` command line: thin typer apps that call one function per command.

Each sub-module owns one group of commands; this module only assembles them, and
``_lazy.py`` imports a command's module when that command runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from autotune import __version__
from autotune.cli._lazy import LazyCommands

app = typer.Typer(
    cls=LazyCommands,  # each command's module is imported when it runs
    name="autotune",
    help="Find the fastest vLLM launch configuration for your GPU and your traffic.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(asked: bool) -> None:
    if asked:
        from autotune.engines.sim import SIM_ENGINE_VERSION  # the simulator: --version only

        print(f"autotune {__version__} (simulator: {SIM_ENGINE_VERSION})")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print autotune's version and the simulator's engine version, and exit.",
        ),
    ] = False,
) -> None:
    """Find the fastest vLLM launch configuration for your GPU and your traffic."""


def main() -> None:
    """Console-script entry point."""
    app()
