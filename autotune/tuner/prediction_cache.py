"""Predictions kept: on disk beside the studies, and in the study itself.

A prediction (``SimOracle.score`` of a config) is a pure function of its inputs: the
simulator's code and catalogs, the GPU and model entries, the calibration profile, the
workload plan, the load, the goal, the seed and the config's flags. ``oracle_digest``
hashes every input but the flags (the code as a digest of the package's files, so an
edit or an upgrade misses); an entry's key hashes that digest with the config's launch
key (``CachedPredictions.entry_key``). A change to any input is another key: nothing
stale is ever read.

``CachedPredictions`` is the prediction cache the tuner reads and writes, a mapping
from launch key to ``Score`` (None: not predictable) that looks in three places in turn:
what this process predicted, what the study stores (``read_stored`` / ``store``: a
resume and ``autotune worker`` start from them, on any host), and the disk cache
(``PredictionStore``: one SQLite file beside the studies, shared by every run and
worker on this host). A cache that cannot be read or written is switched off with a
reason (``CachedPredictions.problem``); the run goes on predicting.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import platform
import sqlite3
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import optuna

import autotune
from autotune import __version__
from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.defaults import default_artifact_dir
from autotune.trial.objective import Score
from autotune.tuner.predictor import SimOracle

CACHE_ENV = "AUTOTUNE_PREDICTION_CACHE"  # a file for the disk cache, or "off"
CACHE_FILE = Path("cache") / "predictions.sqlite"  # under the studies folder
MAX_ENTRIES = 200_000  # the disk cache keeps the newest this many (about 60 MB)
FLUSH_EVERY = 256  # predictions buffered before they are written to disk
STUDY_ATTR = "warm_start_predictions"  # the study user attr holding the warm start's
KEY_CHARS = 32  # hex digits of an entry key (128 bits)
PACKAGE = Path(autotune.__file__).resolve().parent


def files_digest(root: Path) -> str:
    """A hash of every file under ``root`` (names relative to it, and contents), with the
    autotune, Python and numpy versions that run them."""
    digest = hashlib.sha256(f"{__version__}|{platform.python_version()}|{np.__version__}".encode())
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def code_digest() -> str:
    """``files_digest`` of the autotune package that runs (its code and catalogs)."""
    return files_digest(PACKAGE)


def oracle_digest(oracle: SimOracle) -> str:
    """A hash of everything ``oracle``'s predictions depend on but the config's flags."""
    goal = oracle.goal
    inputs = {
        "code": code_digest(),
        "hardware": oracle.hardware,
        "gpu": get_gpu(oracle.hardware).model_dump(mode="json"),
        "sim_model": oracle.sim_model,
        "model": get_model(oracle.sim_model).model_dump(mode="json"),
        "plan": oracle.plan.content_digest,
        "load": oracle.load.model_dump(mode="json"),
        "goal": {
            "objectives": [str(name) for name in goal.objectives],
            "slos": [slo.model_dump(mode="json") for slo in goal.slos],
            "max_error_rate": goal.max_error_rate,
        },
        "calibration": None
        if oracle.calibration is None
        else oracle.calibration.model_dump(mode="json"),
        "seed": oracle.seed,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def encode_score(score: Score | None) -> list[Any] | None:
    """A Score as JSON (floats round-trip exactly)."""
    if score is None:
        return None
    return [score.values, score.constraints, score.outcome]


def decode_score(row: list[Any] | None) -> Score | None:
    if row is None:
        return None
    values, constraints, outcome = row
    return Score(values=values, constraints=constraints, outcome=outcome)


def default_cache_path(storage_url: str) -> Path | None:
    """Where the disk cache lives: ``$AUTOTUNE_PREDICTION_CACHE`` ("off": nowhere), else
    ``cache/predictions.sqlite`` in the studies folder (beside a SQLite storage's file)."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "0", "off", "none") else Path(chosen)
    return default_artifact_dir(storage_url).parent / CACHE_FILE


class PredictionStore:
    """The disk cache: entry key -> encoded Score in one SQLite file (WAL, so several
    processes read and write it at once), the newest ``MAX_ENTRIES`` kept."""

    def __init__(self, path: Path, *, max_entries: int = MAX_ENTRIES) -> None:
        self.path = path
        self.max_entries = max_entries
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=60, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS predictions "
            "(key TEXT PRIMARY KEY, score TEXT NOT NULL, written REAL NOT NULL)"
        )

    def get(self, key: str) -> tuple[bool, Score | None]:
        """(found, score) for ``key``."""
        row = self._db.execute("SELECT score FROM predictions WHERE key = ?", (key,)).fetchone()
        return (False, None) if row is None else (True, decode_score(json.loads(row[0])))

    def put_many(self, items: Iterable[tuple[str, Score | None]]) -> None:
        now = time.time()
        rows = [(key, json.dumps(encode_score(score)), now) for key, score in items]
        with self._db:  # one transaction
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("INSERT OR REPLACE INTO predictions VALUES (?, ?, ?)", rows)
            (count,) = self._db.execute("SELECT COUNT(*) FROM predictions").fetchone()
            if count > self.max_entries:  # the oldest go, a tenth more than needed at once
                excess = count - self.max_entries + self.max_entries // 10
                self._db.execute(
                    "DELETE FROM predictions WHERE key IN "
                    "(SELECT key FROM predictions ORDER BY written LIMIT ?)",
                    (excess,),
                )

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM predictions").fetchone()[0]

    def close(self) -> None:
        self._db.close()


class _StudyAttrs(Protocol):
    @property
    def user_attrs(self) -> dict[str, Any]: ...

    def set_user_attr(self, key: str, value: Any) -> None: ...


@dataclass(frozen=True)
class StoredPredictions:
    """What a study stores of its warm start: the oracle digest they were made under and
    the entries (entry key -> encoded Score), compressed (study attr ``STUDY_ATTR``)."""

    oracle: str
    entries: dict[str, list[Any] | None]

    def attr(self) -> dict[str, Any]:
        data = zlib.compress(json.dumps(self.entries, separators=(",", ":")).encode(), 9)
        return {
            "oracle": self.oracle,
            "count": len(self.entries),
            "data": base64.b64encode(data).decode(),
        }

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> StoredPredictions | None:
        """The stored predictions in a study's user attrs; None when absent or unreadable."""
        found = attrs.get(STUDY_ATTR)
        if not isinstance(found, dict):
            return None
        try:
            entries = json.loads(zlib.decompress(base64.b64decode(found["data"])))
            return cls(oracle=str(found["oracle"]), entries=dict(entries))
        except (KeyError, TypeError, ValueError, zlib.error):
            return None


def read_stored(storage: optuna.storages.BaseStorage, study_name: str) -> StoredPredictions | None:
    """The predictions study ``study_name`` stores, if it exists and stores any."""
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return None
    return StoredPredictions.from_attrs(storage.get_study_user_attrs(study_id))


class CachedPredictions(MutableMapping[str, Score | None]):
    """The tuner's prediction cache for one oracle (see the module docstring)."""

    def __init__(
        self,
        oracle: SimOracle,
        *,
        disk: Path | None = None,
        stored: StoredPredictions | None = None,
    ) -> None:
        self.digest = oracle_digest(oracle)
        self._memory: dict[str, Score | None] = {}
        self._stored: dict[str, list[Any] | None] = {}
        self.stale_stored = 0  # stored entries made under other inputs (not used)
        if stored is not None and stored.oracle == self.digest:
            self._stored = stored.entries
        elif stored is not None:
            self.stale_stored = len(stored.entries)
        self._pending: list[tuple[str, Score | None]] = []
        self.problem: str | None = None  # why the disk cache is off, if it failed
        self.hits = {"study": 0, "disk": 0}
        self._disk: PredictionStore | None = None
        if disk is not None:
            try:
                self._disk = PredictionStore(disk)
            except (sqlite3.Error, OSError) as exc:
                self._switch_off(disk, exc)

    def entry_key(self, key: str) -> str:
        return hashlib.sha256(f"{self.digest}\n{key}".encode()).hexdigest()[:KEY_CHARS]

    @property
    def disk_path(self) -> Path | None:
        return None if self._disk is None else self._disk.path

    def _switch_off(self, path: Path, exc: Exception) -> None:
        self.problem = f"prediction cache {path} off: {exc}"
        if self._disk is not None:
            self._disk.close()
        self._disk = None

    def _find(self, key: str) -> bool:
        """Whether ``key`` is known, bringing it into memory from the study or the disk."""
        if key in self._memory:
            return True
        entry = self.entry_key(key)
        if entry in self._stored:
            try:
                self._memory[key] = decode_score(self._stored[entry])
            except (TypeError, ValueError):  # a mangled entry: predicted again
                del self._stored[entry]
                return self._find(key)
            self.hits["study"] += 1
            return True
        if self._disk is None:
            return False
        try:
            found, score = self._disk.get(entry)
        except (sqlite3.Error, OSError, ValueError) as exc:  # ValueError: a mangled row
            self._switch_off(self._disk.path, exc)
            return False
        if found:
            self._memory[key] = score
            self.hits["disk"] += 1
        return found

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._find(key)

    def __getitem__(self, key: str) -> Score | None:
        if not self._find(key):
            raise KeyError(key)
        return self._memory[key]

    def __setitem__(self, key: str, value: Score | None) -> None:
        self._memory[key] = value
        if self._disk is not None:
            self._pending.append((self.entry_key(key), value))
            if len(self._pending) >= FLUSH_EVERY:
                self.flush()

    def __delitem__(self, key: str) -> None:
        del self._memory[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._memory))

    def __len__(self) -> int:
        return len(self._memory)

    def flush(self) -> None:
        """Write what was predicted since the last flush to the disk cache."""
        if self._disk is None or not self._pending:
            return
        pending, self._pending = self._pending, []
        try:
            self._disk.put_many(pending)
        except (sqlite3.Error, OSError) as exc:
            self._switch_off(self._disk.path, exc)

    def close(self) -> None:
        self.flush()
        if self._disk is not None:
            self._disk.close()
            self._disk = None

    def store(self, study: _StudyAttrs, keys: Iterable[str]) -> bool:
        """Store the predictions of ``keys`` (those known) in ``study``, with what it
        already stores under the same inputs; whether that changed what it stores."""
        entries = dict(self._stored)
        for key in keys:
            if key in self._memory:
                entries[self.entry_key(key)] = encode_score(self._memory[key])
        if entries == self._stored and STUDY_ATTR in study.user_attrs:
            return False
        study.set_user_attr(STUDY_ATTR, StoredPredictions(self.digest, entries).attr())
        self._stored = entries
        return True
