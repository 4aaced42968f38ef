"""autotune's exception tree.

    AutotuneError                 every error autotune raises on purpose
    ├── InputError                bad user input (file, line, field named); CLI exit 2
    │   ├── WorkloadError         a workload file that cannot be read
    │   ├── SpaceError            a search-space file that cannot be read
    │   ├── SettingsError         a tuner settings file or section that cannot be read
    │   └── StudyMismatchError    resuming a study with another space / workload
    ├── StorageError              a storage URL that cannot be opened
    ├── EngineError               the engine could not be driven (not a trial outcome)
    │   └── ServerStartFailed     the server did not come up; carries a Failure
    └── ReplayError               the replay could not run: the replayer itself failed
        └── ServerNotAnswering    the server takes connections but answers nothing (stopped, hung)

A server that crashes, OOMs or misses an SLO is a trial outcome, not an
exception: only ServerStartFailed crosses the engine boundary, and trial.py
turns it into an outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.vocabulary import Failure


class AutotuneError(Exception):
    """Root of every error autotune raises on purpose."""


class InputError(AutotuneError):
    """Bad user input. The message names the file, line and field."""


class WorkloadError(InputError):
    """A workload file that cannot be read or validated."""


class SpaceError(InputError):
    """A search-space file that cannot be read or validated."""


class SettingsError(InputError):
    """A ``--tuner FILE`` or a space's ``tuner:`` section that cannot be read or validated."""


class StudyMismatchError(InputError):
    """An existing study was created with another space, workload or objective."""


class StorageError(AutotuneError):
    """A storage URL that cannot be opened."""


class EngineError(AutotuneError):
    """The engine could not be driven at all (missing executable, bad setup)."""


class ServerStartFailed(EngineError):
    """The server did not come up. ``failure`` says why, with the log excerpt."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(f"{failure.failure_class.value}: {failure.message}")
        self.failure = failure


class ReplayError(AutotuneError):
    """The replayer itself failed (never raised for server-side errors)."""


class ServerNotAnswering(ReplayError):
    """The server accepts connections but sends no answer in time (stopped or hung).

    Raised by ``autotune replay``'s replays only: in a trial the trial's time limit
    decides (outcome ``trial-timeout``).
    """


# Translating a storage's own errors (SQLAlchemy's, SQLite's) into one line, where they enter.
# What SQLite says of a file that is not (or no longer) a whole database.
_DAMAGED_SQLITE = (
    "file is not a database",
    "database disk image is malformed",
    "file is encrypted",
)


def unreadable_storage(url: str, exc: BaseException, *, doing: str) -> str:
    """One line for a storage that cannot be opened or read: a damaged SQLite file says
    so and what to do; anything else gives the database's own first line, without the
    SQL and the link SQLAlchemy appends."""
    # Imported here: scripts run in vLLM's own venv (no SQLAlchemy) import this module.
    from sqlalchemy.engine import make_url

    cause = root_cause_text(exc)
    if any(text in cause for text in _DAMAGED_SQLITE) and url.startswith("sqlite"):
        path = make_url(url).database
        return (
            f"--storage {url}: {path} is damaged (SQLite: {cause}) and was left as it is; "
            f"restore it from a backup, or salvage it with `sqlite3 {path} .recover | sqlite3 "
            "recovered.db` and use --storage sqlite:///recovered.db"
        )
    return f"--storage {url}: {doing}: {cause}"


def root_cause_text(exc: BaseException) -> str:
    """The first line of the innermost cause, without SQLAlchemy's ``(module.Error)`` tag."""
    root: BaseException = exc
    while root.__cause__ is not None:
        root = root.__cause__
    orig = getattr(exc, "orig", None)  # a SQLAlchemy DBAPIError's driver error
    if isinstance(orig, BaseException):
        root = orig
    text = (str(root).splitlines() or [type(root).__name__])[0]
    return text.split(") ", 1)[1] if text.startswith("(") and ") " in text else text
