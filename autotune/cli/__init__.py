"""The `autotune` command line: thin typer apps that call one function per command.

Each sub-module owns one group of commands; this module only assembles them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from autotune import __version__
from autotune.cli import plan, record, replay, results, run, sim, trial, worker, workload
from autotune.engines.sim import SIM_ENGINE_VERSION

app = typer.Typer(
    name="autotune",
    help="Find the fastest vLLM launch configuration for your GPU and your traffic.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(asked: bool) -> None:
    if asked:
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


run.register(app)  # run, show, studies
trial.register(app)  # try
results.register(app)  # export, compare, report, explain
replay.register(app)  # replay
record.register(app)  # record
worker.register(app)  # worker
plan.register(app)  # plan
app.add_typer(sim.app, name="sim")
app.add_typer(workload.app, name="workload")


def main() -> None:
    """Console-script entry point."""
    app()
