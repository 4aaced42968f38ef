"""The `autotune` command line: thin typer apps that call one function per command.

Each sub-module owns one group of commands; this module only assembles them.
"""

from __future__ import annotations

import typer

from autotune.cli import record, replay, results, run, sim, trial, worker, workload

app = typer.Typer(
    name="autotune",
    help="Find the fastest vLLM launch configuration for your GPU and your traffic.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
run.register(app)  # run, show, studies
trial.register(app)  # try
results.register(app)  # export, compare, report, explain
replay.register(app)  # replay
record.register(app)  # record
worker.register(app)  # worker
app.add_typer(sim.app, name="sim")
app.add_typer(workload.app, name="workload")


def main() -> None:
    """Console-script entry point."""
    app()
