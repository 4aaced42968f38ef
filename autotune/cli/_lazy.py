"""The root command group: each command's module is imported when that command runs.

A command module imports its domain (the study loop, Optuna, pandas, the simulator), so
importing all of them costs seconds; ``autotune --help`` lists the commands from
``COMMANDS`` instead, and ``autotune CMD`` imports CMD's module alone. A test renders
the listing both ways (tests/cli/test_lazy_help.py), so the table cannot drift.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup


@dataclass(frozen=True)
class LazyCommand:
    """Where a command is defined and the line ``--help`` lists it with."""

    module: str  # autotune.cli.NAME: its register(app), or its `app` for a group
    help: str


COMMANDS = {
    "run": LazyCommand(
        "run",
        "Tune: propose configs, launch, replay, score; resume by running the same command again.",
    ),
    "show": LazyCommand(
        "run", "The trials of a study, best first: flags, outcome, score, margins, server stats."
    ),
    "studies": LazyCommand("run", "The studies in a storage, with trial counts and best values."),
    "try": LazyCommand(
        "trial", "Launch the space's baseline (with --set changes), replay, score, stop: no study."
    ),
    "export": LazyCommand(
        "results",
        "Export the best configuration (or --trial N) as a command, a YAML config, or JSON.",
    ),
    "compare": LazyCommand(
        "results",
        "One table across studies: best config, throughput, latency, KV tokens, tok/s per $.",
    ),
    "report": LazyCommand(
        "results", "Write a self-contained HTML report (plots inlined; opens with no network)."
    ),
    "explain": LazyCommand(
        "results",
        "Explain, from the measured trials, why the best config wins and where OOM begins.",
    ),
    "dashboard": LazyCommand(
        "results",
        "Open the studies in optuna-dashboard (server logs and request CSVs as artifacts).",
    ),
    "bench": LazyCommand(
        "bench", "Run a `vllm bench serve` command line on a server or the simulator."
    ),
    "replay": LazyCommand(
        "replay", "Replay a workload against a running OpenAI/Anthropic-compatible server."
    ),
    "record": LazyCommand(
        "record", "Proxy OpenAI / Anthropic traffic to UPSTREAM and record it as a workload."
    ),
    "worker": LazyCommand(
        "worker",
        "Run trials of a study beside other workers until it has its --trials COMPLETE ones.",
    ),
    "plan": LazyCommand(
        "plan",
        "Plan a fleet: the cheapest GPU kind and replica count that meets the SLOs at a load.",
    ),
    "sim": LazyCommand("sim", "The built-in vLLM simulator."),
    "workload": LazyCommand("workload", "Workload files: import, inspect, cut, generate."),
}
GROUPS = ("bench", "sim", "workload")  # modules with an `app` of their own, added as a group


class LazyCommands(TyperGroup):
    """A TyperGroup whose ``COMMANDS`` are imported on first use; ``--help`` lists them
    from the table without importing any. (Contexts and commands are typed ``Any``:
    they are the click that typer vendors, which has no public name.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in COMMANDS if n not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        if self._listing:
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].help)
        return self.load(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def load(self, cmd_name: str) -> Any:
        """Import the module of ``cmd_name`` and add its command (or group)."""
        module = importlib.import_module(f"autotune.cli.{COMMANDS[cmd_name].module}")
        holder = typer.Typer()
        holder.callback()(lambda: None)  # a group even when the module has one command
        if cmd_name in GROUPS:
            holder.add_typer(module.app, name=cmd_name)
        else:
            module.register(holder)
        command = typer.main.get_command(holder).commands[cmd_name]
        self.add_command(command, cmd_name)
        return command
