"""Loading a stored study into typed rows: study attrs and one ``TrialRow`` per trial.

docs/architecture.md ("What a study stores") fixes which user attrs a study
and its trials carry; a trial's are read by ``trial_record.TrialRecord``.
Export, compare, report and explain read them only through ``LoadedStudy``
and ``TrialRow`` below, never through raw dicts.
"""

from __future__ import annotations

import math
import shlex
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import optuna
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from autotune.defaults import DEFAULT_STORAGE_URL, default_artifact_dir
from autotune.errors import InputError, StorageError, unreadable_storage
from autotune.trial.objective import ObjectiveName
from autotune.trial.record import TrialRecord, outcome_text
from autotune.tuner.record import TunerStudyRecord, Winner
from autotune.vocabulary import OOM_OUTCOMES, HardwareFingerprint

M = TypeVar("M", bound=BaseModel)


class StudyInfo(BaseModel):
    """The study-level user attrs, typed."""

    model_config = ConfigDict(frozen=True)

    name: str
    autotune_version: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    hardware: HardwareFingerprint | None = None
    model: str | None = None
    workload: dict[str, Any] = {}
    load: dict[str, Any] = {}
    objectives: tuple[str, ...] = ()
    directions: tuple[str, ...] = ()
    slos: tuple[str, ...] = ()
    max_error_rate: float | None = None
    space: dict[str, Any] = {}
    time_scale: float = 1.0
    calibration: dict[str, Any] | None = None  # the profile's digest and provenance

    @property
    def gpu_name(self) -> str:
        return self.hardware.gpu_name if self.hardware else "unknown GPU"

    @property
    def workload_name(self) -> str:
        return str(self.workload.get("name") or self.workload.get("path") or "unknown workload")

    @property
    def primary_objective(self) -> str:
        return self.objectives[0] if self.objectives else "throughput"

    @property
    def primary_maximize(self) -> bool:
        return not self.directions or self.directions[0] == "maximize"


class TrialRow(TrialRecord):
    """One trial: its Optuna state and values plus its stored ``TrialRecord``."""

    number: int
    state: str  # optuna TrialState name: COMPLETE, FAIL, RUNNING, ...
    values: tuple[float, ...] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    constraints: dict[str, float] = Field(default_factory=dict)
    datetime_start: datetime | None = None
    datetime_complete: datetime | None = None

    @property
    def outcome_text(self) -> str:
        return outcome_text(self.outcome, self.state)

    @property
    def feasible(self) -> bool:
        """COMPLETE with every constraint <= 0 (Optuna's own rule)."""
        return self.state == "COMPLETE" and all(v <= 0 for v in self.constraints.values())

    @property
    def is_oom(self) -> bool:
        return self.outcome in OOM_OUTCOMES or self.constraints.get("oom", -1.0) > 0

    @property
    def throughput_tok_s(self) -> float | None:
        return self.replay.output_throughput_tok_s if self.replay else None

    @property
    def ttft_p95_s(self) -> float | None:
        return self.replay.ttft.p95 if self.replay else None

    @property
    def tpot_p95_s(self) -> float | None:
        return self.replay.tpot.p95 if self.replay else None

    @property
    def e2e_p95_s(self) -> float | None:
        return self.replay.e2e.p95 if self.replay else None

    @property
    def kv_cache_tokens(self) -> int | None:
        """Token capacity of the KV pool: the startup log, else /metrics."""
        if self.startup and self.startup.kv_cache_tokens is not None:
            return self.startup.kv_cache_tokens
        return self.server_stats.kv_cache_tokens if self.server_stats else None

    @property
    def concurrency_reached(self) -> int | None:
        """Most requests the server ran at once (its own gauge), else the client's count."""
        if self.server_stats and self.server_stats.peak_running:  # 0: no scrape saw a batch
            return self.server_stats.peak_running
        return self.replay.max_concurrent_requests if self.replay else None

    @property
    def flags(self) -> dict[str, Any]:
        return dict(self.config.flags) if self.config else {}


class LoadedStudy:
    """A study read from storage: typed info, typed trial rows, and the Optuna study."""

    def __init__(self, study: optuna.Study, storage_url: str) -> None:
        self.study = study
        self.storage_url = storage_url
        self.info = _study_info(study)
        self.trials = [_trial_row(study.study_name, t) for t in study.get_trials(deepcopy=False)]
        self._by_number = {row.number: row for row in self.trials}

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def multi_objective(self) -> bool:
        return len(self.study.directions) > 1

    def command(self, *words: str) -> str:
        """A follow-up command on this study, ready to copy: ``autotune WORDS`` with
        ``--storage`` (unless it is the default) and ``--study``."""
        where = [] if self.storage_url == DEFAULT_STORAGE_URL else ["--storage", self.storage_url]
        head, *rest = words
        return shlex.join(["autotune", head, *where, "--study", self.name, *rest])

    def stored_file(self, path: str, option: str) -> Path:
        """A file the study names (its workload, its space) as `autotune run` was given it,
        relative to where it ran; when that is not found from here, the absolute path the
        run's options kept under ``option``."""
        given = Path(path)
        if given.is_file() or given.is_absolute():
            return given
        kept = (self.study.user_attrs.get("run_options") or {}).get(option)
        return Path(kept) if kept and Path(kept).is_file() else given

    def trial(self, number: int) -> TrialRow:
        """The trial with this number; ``InputError`` when there is none."""
        try:
            return self._by_number[number]
        except KeyError:
            raise InputError(
                f"study {self.name!r}: no trial {number} (trials are 0..{len(self.trials) - 1})"
            ) from None

    def baseline(self) -> TrialRow | None:
        """The first trial marked ``is_baseline``, if any."""
        return next((row for row in self.trials if row.is_baseline), None)

    def feasible_measured(self) -> list[TrialRow]:
        return [row for row in self.trials if row.feasible and row.measured and row.values]

    def crowned(self) -> Winner | None:
        """The tuner's crown: the config its re-measurements favour (single objective)."""
        winner = TunerStudyRecord.read(self.study.user_attrs).winner
        if winner is None or self.multi_objective or winner.trial not in self._by_number:
            return None
        return winner

    def best(self) -> TrialRow:
        """The best feasible trial; for multi-objective, the Pareto point best on the first.

        Raises ``InputError`` when no trial is feasible yet.
        """
        winner = self.crowned()
        if winner is not None:
            return self._by_number[winner.trial]
        candidates = self.pareto() if self.multi_objective else self.feasible_measured()
        if not candidates:
            raise InputError(f"study {self.name!r}: no feasible trial has completed yet")
        return max(candidates, key=self.primary_key)

    def pareto(self) -> list[TrialRow]:
        """The feasible Pareto front, as Optuna computes it."""
        numbers = [t.number for t in self.study.best_trials]
        return [self._by_number[n] for n in numbers if self._by_number[n].measured]

    def primary_key(self, row: TrialRow) -> float:
        """Sort key: larger is better on the study's first objective."""
        value = row.values[0] if row.values else -math.inf
        return value if self.info.primary_maximize else -value

    def value_of(self, row: TrialRow) -> float | None:
        """``row``'s value on the first objective: the mean of the crown's measurements when
        ``row`` is the crowned trial (one lucky run is not the figure to quote), else its
        own measurement."""
        winner = self.crowned()
        if winner is not None and winner.trial == row.number:
            return winner.mean
        return row.values[0] if row.values else None

    def throughput_of(self, row: TrialRow) -> float | None:
        """``row``'s output tok/s, as ``value_of`` quotes it when throughput is the
        objective (the crown's mean); else the row's own measurement."""
        if self.info.primary_objective == ObjectiveName.THROUGHPUT:
            return self.value_of(row)
        return row.throughput_tok_s

    def gain_over_baseline(self, row: TrialRow) -> float | None:
        """``row / baseline`` on the first objective (inverted when minimised), if measurable."""
        base = self.baseline()
        ours = self.value_of(row)
        if base is None or not base.measured or not base.values or ours is None:
            return None
        theirs = base.values[0]
        if self.info.primary_maximize:
            return ours / theirs if theirs > 0 else None
        return theirs / ours if ours > 0 else None


def _validated(model: type[M], value: Any, *, where: str) -> M | None:
    if value is None:
        return None
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in first["loc"])
        raise InputError(f"{where}.{path}: {first['msg']}") from exc


def _study_info(study: optuna.Study) -> StudyInfo:
    attrs = study.user_attrs
    where = f"study {study.study_name!r} user attr"
    fields = {key: attrs[key] for key in StudyInfo.model_fields if key in attrs}
    fields["hardware"] = _validated(
        HardwareFingerprint, attrs.get("hardware"), where=f"{where} hardware"
    )
    if isinstance(attrs.get("slos"), dict):  # {"slos": [...], "max_error_rate": x} form
        fields["slos"] = attrs["slos"].get("slos", [])
        fields["max_error_rate"] = attrs["slos"].get("max_error_rate")
    if "directions" not in fields:
        fields["directions"] = [d.name.lower() for d in study.directions]
    if "objectives" not in fields and study.metric_names:
        fields["objectives"] = study.metric_names
    try:
        return StudyInfo(name=study.study_name, **fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"{where} {first['loc'][0]}: {first['msg']}") from exc


def _trial_row(study_name: str, trial: optuna.trial.FrozenTrial) -> TrialRow:
    record = TrialRecord.read(
        trial.user_attrs, where=f"study {study_name!r} trial {trial.number} user attr"
    )
    return TrialRow(
        number=trial.number,
        state=trial.state.name,
        values=tuple(trial.values) if trial.values else None,
        params=dict(trial.params),
        constraints=dict(trial.constraints),
        datetime_start=_utc(trial.datetime_start),
        datetime_complete=_utc(trial.datetime_complete),
        **{name: getattr(record, name) for name in TrialRecord.model_fields},
    )


def _utc(value: datetime | None) -> datetime | None:
    """Optuna hands back naive local times; make them explicit UTC."""
    return value.astimezone(UTC).replace(microsecond=0) if value else None


def _check_sqlite_exists(storage_url: str) -> None:
    """Reading must not create an empty database where the user mistyped a path."""
    try:
        url = make_url(storage_url)
    except ArgumentError as exc:
        raise StorageError(f"--storage {storage_url!r}: not a database URL ({exc})") from exc
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        path = Path(url.database)
        if not path.exists():
            raise StorageError(f"--storage {storage_url!r}: {path} does not exist")


def study_names(storage_url: str) -> list[str]:
    """Every study in the storage, oldest first. Raises ``StorageError``."""
    _check_sqlite_exists(storage_url)
    try:
        summaries = optuna.get_all_study_summaries(storage=storage_url, include_best_trial=False)
    except (SQLAlchemyError, ValueError, RuntimeError, ImportError) as exc:
        raise StorageError(unreadable_storage(storage_url, exc, doing="cannot be read")) from exc
    return [summary.study_name for summary in summaries]


def resolve_study_name(storage_url: str, study_name: str | None) -> str:
    """The named study, else the only or most recently created one."""
    names = study_names(storage_url)
    if not names:
        raise InputError(f"--storage {storage_url!r}: holds no study yet")
    if study_name is None:
        return names[-1]
    if study_name not in names:
        raise InputError(f"--study {study_name!r}: not in {storage_url} (has: {', '.join(names)})")
    return study_name


def load_study(storage_url: str, study_name: str | None = None) -> LoadedStudy:
    """Load one study and type its trials. Raises ``StorageError`` or ``InputError``."""
    name = resolve_study_name(storage_url, study_name)
    try:
        study = optuna.load_study(study_name=name, storage=storage_url)
    except (SQLAlchemyError, KeyError) as exc:
        raise StorageError(
            unreadable_storage(storage_url, exc, doing=f"cannot load study {name!r}")
        ) from exc
    try:
        return LoadedStudy(study, storage_url)
    except SQLAlchemyError as exc:  # the study's own rows are damaged
        raise StorageError(
            unreadable_storage(storage_url, exc, doing=f"cannot read study {name!r}")
        ) from exc


def dashboard_argv(
    storage_url: str, *, artifact_dir: Path | None = None, host: str = "127.0.0.1", port: int = 8080
) -> list[str]:
    """The optuna-dashboard command for this storage. Raises ``InputError`` if not installed."""
    _check_sqlite_exists(storage_url)
    # autotune's own environment first: a venv run by path is not on PATH.
    executable = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent))
    executable = executable or shutil.which("optuna-dashboard")
    if executable is None:
        raise InputError("optuna-dashboard is not installed: pip install optuna-dashboard")
    artifacts = artifact_dir or default_artifact_dir(storage_url)
    return [
        executable,
        storage_url,
        "--artifact-dir",
        str(artifacts),
        "--host",
        host,
        "--port",
        str(port),
    ]
