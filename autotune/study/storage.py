"""The study's storage: opening it (SQLite or PostgreSQL), its write errors, counted trials."""

from __future__ import annotations

import contextlib
import errno
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine import make_url

from autotune.errors import StorageError, root_cause_text, unreadable_storage
from autotune.study.spec import StudySpec

# Trials that spent a launch of the --trials budget: measured, failed, or pruned early.
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED)
GRACE_HEARTBEATS = 3  # a RUNNING trial silent this many heartbeat intervals is stale
# What a storage that stops taking writes raises: the database's errors (Optuna wraps
# them), and a full or read-only disk under the artifacts.
STORAGE_FAILURES: tuple[type[BaseException], ...] = (
    optuna.exceptions.StorageInternalError,
    sqlalchemy.exc.SQLAlchemyError,
)
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class StorageStopped(BaseException):
    """The storage stopped taking writes during a trial (``storage_failure`` says how).

    A BaseException, as KeyboardInterrupt is, so that Optuna's trial loop lets it through
    without telling the trial's end to a storage that cannot take it (its tell fails,
    then asserts "Should not reach"); the study loop turns it into one line.
    """

    def __init__(self, storage_failure: BaseException) -> None:
        super().__init__(str(storage_failure))
        self.storage_failure = storage_failure


class StudyStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose heartbeat outlives a storage that stops taking writes.

    Optuna records heartbeats from a thread of its own, where a full disk is a traceback
    per interval. Here a heartbeat that fails is let go: the trial's own next write
    fails too, and that one ends the study with one line (``StorageStopped``).
    """

    def record_heartbeat(self, trial_id: int) -> None:
        with contextlib.suppress(*STORAGE_FAILURES):
            super().record_heartbeat(trial_id)


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
    url: str,
    *,
    heartbeat_interval_s: int | None = None,
    on_stale_trial: Callable[[optuna.Study, FrozenTrial], None] | None = None,
) -> StudyStorage:
    """An RDBStorage for ``url``, with a heartbeat when ``heartbeat_interval_s`` is given:
    a trial silent for ``GRACE_HEARTBEATS`` intervals is failed, then handed to
    ``on_stale_trial`` (the budget's retry). Errors name the URL in one line."""
    url = storage_url(url)
    try:
        if url.startswith("sqlite:///"):
            path = Path(url.removeprefix("sqlite:///"))
            if str(path) not in ("", ":memory:"):
                _make_folder(url, path.parent)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            heartbeat: dict[str, Any] = {}
            if heartbeat_interval_s:
                heartbeat = {
                    "heartbeat_interval": heartbeat_interval_s,
                    "grace_period": GRACE_HEARTBEATS * heartbeat_interval_s,
                    "heartbeat_stale_trial_callback": on_stale_trial,
                }
            return StudyStorage(
                url, engine_kwargs={"connect_args": _connect_args(url)}, **heartbeat
            )
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError, OSError) as exc:
        raise StorageError(unreadable_storage(url, exc, doing="cannot open")) from exc


def _make_folder(url: str, folder: Path) -> None:
    """The SQLite file's folder; a file where a folder must be is named in one line."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        blocking = next(
            (p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), folder
        )
        raise StorageError(
            f"--storage {url}: cannot create the folder {folder}: {blocking} is a file, "
            "not a folder"
        ) from exc


def is_storage_failure(exc: BaseException) -> bool:
    """The storage stopped taking writes: a database error, or a full or read-only disk."""
    if isinstance(exc, STORAGE_FAILURES):
        return True
    return isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS


def _connect_args(url: str) -> dict[str, Any]:
    return {"timeout": 30} if url.startswith("sqlite") else {}


@contextlib.contextmanager
def storage_write_errors(url: str) -> Iterator[None]:
    """A storage that stops taking writes (disk full, read-only, locked) mid-study: one line.

    Each trial is its own transaction, so what was stored before stays whole; a trial
    the storage could not even mark failed is recovered as stale on the next run.
    """
    try:
        yield
    except StorageStopped as stopped:  # during a trial: the runner recorded what it could
        exc = stopped.storage_failure
        raise StorageError(_write_failed(url, exc)) from exc
    except (*STORAGE_FAILURES, OSError) as exc:
        if not is_storage_failure(exc):
            raise
        raise StorageError(_write_failed(url, exc)) from exc


def _write_failed(url: str, exc: BaseException) -> str:
    return (
        f"--storage {url}: writing the study failed: {root_cause_text(exc)}. The trials "
        "stored before are intact; make room (or fix permissions, or stop the other "
        "writer) and rerun the same command to resume"
    )


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
