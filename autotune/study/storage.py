"""The study's storage: opening it (SQLite or PostgreSQL), its write errors, counted trials."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from autotune.errors import StorageError
from autotune.study.spec import StudySpec

# Trials that spent a launch of the --trials budget: measured, failed, or pruned early.
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED)


def storage_url_of(text: str) -> str:
    """The URL a ``--storage`` value names: a database URL as it is, a plain path (no
    ``scheme://``) as a SQLite file; StorageError for a scheme SQLAlchemy has no dialect
    of, or whose driver is not installed."""
    if "://" not in text:
        return f"sqlite:///{Path(text).expanduser()}"
    scheme = text.split("://", 1)[0]
    try:
        make_url(storage_url(text)).get_dialect().import_dbapi()
    except sqlalchemy.exc.NoSuchModuleError:
        raise StorageError(
            f"--storage {text}: unknown database scheme {scheme!r} (sqlite:///PATH, "
            "postgresql://USER@HOST/DB, or a plain path of a SQLite file)"
        ) from None
    except sqlalchemy.exc.ArgumentError as exc:
        raise StorageError(f"--storage {text}: not a database URL ({exc})") from None
    except ImportError as exc:
        raise StorageError(
            f"--storage {text}: the {scheme} driver is not installed ({exc}); for PostgreSQL: "
            "pip install -e '.[postgres]'"
        ) from None
    return text


def storage_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 (the ``postgres`` extra), not SQLAlchemy's psycopg2."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url


def open_storage(
    url: str, *, heartbeat_interval_s: int | None = None
) -> optuna.storages.RDBStorage:
    """An RDBStorage for ``url`` with heartbeat and stale-trial retry; errors name the URL."""
    url = storage_url(url)
    try:
        if url.startswith("sqlite:///"):
            path = Path(url.removeprefix("sqlite:///"))
            if str(path) not in ("", ":memory:"):
                path.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            heartbeat: dict[str, Any] = {}
            if heartbeat_interval_s:
                heartbeat = {
                    "heartbeat_interval": heartbeat_interval_s,
                    "grace_period": 3 * heartbeat_interval_s,
                    "heartbeat_stale_trial_callback": (
                        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
                    ),
                }
            return optuna.storages.RDBStorage(
                url, engine_kwargs={"connect_args": _connect_args(url)}, **heartbeat
            )
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError, OSError) as exc:
        raise StorageError(f"--storage {url}: cannot open: {exc}".splitlines()[0]) from exc


def _connect_args(url: str) -> dict[str, Any]:
    return {"timeout": 30} if url.startswith("sqlite") else {}


@contextlib.contextmanager
def storage_write_errors(url: str) -> Iterator[None]:
    """A storage that stops taking writes (disk full, read-only, locked) mid-study: one line.

    Each trial is its own transaction, so what was stored before stays whole; the
    trial that was running is recovered as stale on the next run.
    """
    try:
        yield
    except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as exc:
        root: BaseException = exc
        while root.__cause__ is not None:
            root = root.__cause__
        cause = (str(root).splitlines() or [type(root).__name__])[0]
        raise StorageError(
            f"--storage {url}: writing the study failed: {cause}. The trials stored before are "
            "intact; make room (or fix permissions, or stop the other writer) and rerun the "
            "same command to resume"
        ) from exc


def completed_count(study: optuna.Study) -> int:
    """Finished trials that count towards ``--trials``: COMPLETE and PRUNED."""
    return len(study.get_trials(deepcopy=False, states=COUNTED_STATES))


def stored_run_options(url: str, name: str) -> dict[str, Any] | None:
    """The run options study ``name`` stored (its latest run's), or None when the study
    does not exist or stored none."""
    storage = open_storage(url)
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    options = storage.get_study_user_attrs(study_id).get("run_options")
    return options if isinstance(options, dict) else None


def completed_trials(spec: StudySpec) -> int | None:
    """COMPLETE trials of the study ``spec`` names, or None when it does not exist yet."""
    storage = open_storage(spec.storage_url)
    if spec.name not in optuna.get_all_study_names(storage):
        return None
    return completed_count(optuna.load_study(study_name=spec.name, storage=storage))
