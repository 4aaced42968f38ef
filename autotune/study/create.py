"""Create a study or resume one: its sampler, its attrs, and the checks that refuse
to resume with another space, workload, goal, calibration profile or tuner settings."""

from __future__ import annotations

import importlib.util
import json
import warnings
from typing import Any

import optuna

from autotune import __version__
from autotune.config.space import SearchSpace
from autotune.errors import InputError, StudyMismatchError
from autotune.redaction import redact_json
from autotune.study.spec import StudySpec, prunes
from autotune.trial.pruning import BelowBestPruner
from autotune.tuner.session import Tuner
from autotune.tuner.settings import TunerSettings

IDENTITY_ATTRS = ("space_digest", "workload_digest", "objectives", "engine", "model")


def make_sampler(
    name: str | optuna.samplers.BaseSampler,
    *,
    seed: int | None,
    space: SearchSpace,
    n_trials: int | None,
    engine_version: str | None,
    tuner: Tuner | None = None,
) -> optuna.samplers.BaseSampler:
    """The simulator-guided sampler by default; GP, TPE, random and grid on request.

    "guided" falls back to TPE when there is no simulator prediction to steer by. A
    sampler instance (a benchmark's strategy) is used as it is. With a ``tuner``, the
    sampler is wrapped so that the tuner chooses seeds and re-measurements.
    """
    base = _base_sampler(
        name, seed=seed, space=space, n_trials=n_trials, engine_version=engine_version, tuner=tuner
    )
    return tuner.wrap(base) if tuner is not None else base


def _base_sampler(
    name: str | optuna.samplers.BaseSampler,
    *,
    seed: int | None,
    space: SearchSpace,
    n_trials: int | None,
    engine_version: str | None,
    tuner: Tuner | None,
) -> optuna.samplers.BaseSampler:
    if isinstance(name, optuna.samplers.BaseSampler):
        return name
    startup = min(10, max(4, (n_trials or 30) // 3))
    if name == "guided" and tuner is not None and tuner.sampler is not None:
        return tuner.sampler
    if name == "guided":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
    if name == "gp":
        if importlib.util.find_spec("torch") is None:
            raise InputError(
                "--sampler gp needs torch, which the default install leaves out: "
                "pip install -e '.[gp]' (or use the default sampler, guided)"
            )
        return optuna.samplers.GPSampler(
            seed=seed, n_startup_trials=startup, warn_independent_sampling=False
        )
    if name == "tpe":  # the constant liar: several workers do not pick the same point at once
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(space.grid(engine_version), seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


def study_attrs(spec: StudySpec, engine_version: str) -> dict[str, Any]:
    """The study-level attrs (docs/architecture.md); the identity ones are checked on resume."""
    return {
        "autotune_version": __version__,
        "engine": spec.engine.name,
        "engine_version": engine_version,
        "hardware": spec.engine.hardware().model_dump(mode="json"),
        "model": spec.model,
        "workload": {
            "path": str(spec.workload_path),
            "name": spec.plan.name,
            "digest": spec.plan.digest,
            "requests": len(spec.plan.requests),
            "sessions": len(spec.plan.sessions),
            "token_space": spec.plan.token_space,
        },
        "workload_digest": spec.plan.digest,
        "load": spec.load.model_dump(mode="json"),
        "objectives": [name.value for name in spec.goal.objectives],
        "directions": spec.goal.directions,
        "slos": [slo.text for slo in spec.goal.slos],
        "max_error_rate": spec.goal.max_error_rate,
        "space": {
            "name": spec.space.name,
            "digest": spec.space.digest(),
            "path": str(spec.space_path),
        },
        "space_digest": spec.space.digest(),
        "time_scale": getattr(spec.engine, "time_scale", 1.0),
        "calibration": spec.calibration.provenance() if spec.calibration else None,
        "tuner": spec.tuner.model_dump(mode="json"),
    }


def create_or_resume(
    spec: StudySpec,
    storage: optuna.storages.BaseStorage,
    engine_version: str,
    tuner: Tuner | None = None,
) -> optuna.Study:
    """Create the study, or load it (``check_resumable`` has vetted its identity) and refuse
    other objective directions."""
    sampler = make_sampler(
        spec.sampler,
        seed=spec.seed,
        space=spec.space,
        n_trials=spec.n_trials,
        engine_version=engine_version,
        tuner=tuner,
    )
    pruner = BelowBestPruner() if prunes(spec) else optuna.pruners.NopPruner()
    if spec.name in optuna.get_all_study_names(storage):
        study = optuna.load_study(
            study_name=spec.name, storage=storage, sampler=sampler, pruner=pruner
        )
        if list(study.directions) != [_direction(d) for d in spec.goal.directions]:
            raise StudyMismatchError(f"study {spec.name!r} has other objective directions")
        return study
    study = optuna.create_study(
        study_name=spec.name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        directions=spec.goal.directions,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(spec.goal.metric_names)
    for key, value in study_attrs(spec, engine_version).items():
        study.set_user_attr(key, redact_json(value))
    return study


def check_resumable(
    spec: StudySpec, storage: optuna.storages.BaseStorage, engine_version: str
) -> None:
    """StudyMismatchError when study ``spec.name`` exists with another space, workload,
    goal, engine, model, calibration profile or tuner settings. Checked before the warm
    start, so that a refusal does not wait for the whole space to be predicted."""
    existing = {summary.study_name: summary for summary in optuna.get_all_study_summaries(storage)}
    if spec.name not in existing:
        return
    attrs = study_attrs(spec, engine_version)
    stored = existing[spec.name].user_attrs
    for key in IDENTITY_ATTRS:
        if key in stored and stored[key] != attrs[key]:
            raise StudyMismatchError(
                f"study {spec.name!r} was created with another {key.replace('_', ' ')} "
                f"({stored[key]!r}, now {attrs[key]!r}); use --study NEW_NAME"
            )
    _check_same_calibration(spec.name, stored, attrs["calibration"])
    _check_same_tuner(spec.name, stored, attrs["tuner"])


def _check_same_calibration(name: str, stored: dict[str, Any], used: dict[str, Any] | None) -> None:
    """StudyMismatchError when the study's trials were predicted with another profile."""
    if "calibration" not in stored:  # a study older than the attr
        return
    before = stored["calibration"]
    if (before or {}).get("digest") == (used or {}).get("digest"):
        return
    raise StudyMismatchError(
        f"study {name!r} was run with {_profile_words(before)}, now {_profile_words(used)}; "
        "resume with the same simulator.calibration setting, or use --study NEW_NAME"
    )


# Tuner keys each run sets for itself: a safety stop, not what the study searches (a
# study created before it became one stored 300 s).
RUN_OWN_KEYS = {"warm_start_budget_s"}


def _check_same_tuner(name: str, stored: dict[str, Any], used: dict[str, Any]) -> None:
    """StudyMismatchError when the study's trials were chosen with other tuner settings (a
    key an older study did not store reads as its default)."""
    if "tuner" not in stored:  # a study older than the attr
        return
    before = TunerSettings().model_dump(mode="json") | stored["tuner"]
    keys = sorted((before.keys() | used.keys()) - RUN_OWN_KEYS)
    differ = [key for key in keys if before.get(key) != used.get(key)]
    if not differ:
        return
    changes = "; ".join(
        f"{key} {json.dumps(before.get(key))}, now {json.dumps(used.get(key))}" for key in differ
    )
    raise StudyMismatchError(
        f"study {name!r} was run with other tuner settings ({changes}); resume with the same "
        "settings (the space's tuner: section, --tuner FILE), or use --study NEW_NAME"
    )


def _profile_words(provenance: dict[str, Any] | None) -> str:
    if provenance is None:
        return "no calibration profile"
    where = provenance.get("path") or provenance.get("source") or "a profile"
    return f"calibration profile {where} (digest {provenance.get('digest')})"


def _direction(name: str) -> optuna.study.StudyDirection:
    return optuna.study.StudyDirection[name.upper()]
