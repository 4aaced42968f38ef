"""`autotune worker`: join a study `autotune run` set up, from this host or another."""

from __future__ import annotations

import os
from typing import Annotated

import optuna
import typer
from pydantic import ValidationError

from autotune.cli._common import (
    StorageOption,
    console,
    format_validation_error,
    handle_errors,
)
from autotune.cli._run_output import RunOutput
from autotune.cli.run import run_with_output
from autotune.defaults import DEFAULT_STORAGE_URL
from autotune.errors import InputError
from autotune.study import open_storage, run_log_path, worker_name
from autotune.study.setup import RunOptions, prepare_study
from autotune.study.workers import check_hardware, refuse_sqlite, worker_seed


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)


@handle_errors
def worker(
    study: Annotated[str, typer.Option("--study", help="The study to join.")],
    storage: StorageOption = DEFAULT_STORAGE_URL,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="This worker's GPUs, e.g. 2,3 (default: all).")
    ] = None,
    allow_other_hardware: Annotated[
        bool,
        typer.Option(
            "--allow-other-hardware", help="Join although this GPU differs from the study's."
        ),
    ] = False,
    no_summary: Annotated[bool, typer.Option("--no-summary", hidden=True)] = False,
) -> None:
    """Run trials of a study beside other workers until it has its --trials COMPLETE ones.

    The study (on PostgreSQL) was created by `autotune run`; the worker takes that run's
    options from it and needs the same workload and space files at the same paths.
    """
    refuse_sqlite(storage, "autotune worker")
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    handle = open_storage(storage)
    if study not in optuna.get_all_study_names(handle):
        raise InputError(f"--study {study!r}: not in {storage}; create it with `autotune run`")
    attrs = optuna.load_study(study_name=study, storage=handle).user_attrs
    if "run_options" not in attrs:
        raise InputError(
            f"--study {study!r} holds no run options to join with; "
            "run `autotune run` on it once with this version"
        )
    try:
        options = RunOptions.model_validate(
            attrs["run_options"] | {"storage": storage, "study": study}
        )
    except ValidationError as exc:
        raise InputError(
            f"--study {study!r}: its run options are another version's "
            f"({format_validation_error(exc)}); run `autotune run` on it once with this version"
        ) from None
    out = console()
    found: list[str] = []
    spec = prepare_study(options, say=found.append)
    check_hardware(attrs.get("hardware"), spec.engine.hardware(), allow=allow_other_hardware)
    spec.join = True
    spec.seed = worker_seed(spec.seed, worker_name())
    output = RunOutput(out, run_log_path(spec))
    try:
        run_with_output(spec, output, found, resuming=True, summary=not no_summary)
    finally:
        output.close()
