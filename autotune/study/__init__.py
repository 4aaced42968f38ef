"""Optuna orchestration: storage, sampler, the baseline, attrs, resume, artifacts.

Each trial: space -> TrialConfig -> ``trial.run_trial`` -> ``objective.score``
-> values + constraints + attrs. What a study and its trials store is
specified in docs/architecture.md ("What a study stores").

- ``spec``: ``StudySpec``, what `autotune run` decided before the first trial;
- ``storage``: opening the storage, its write errors, the trials that count;
- ``create``: the sampler, the study's attrs, create or resume (and refuse to);
- ``runner``: one trial as Optuna's objective;
- ``loop``: ``run_study``, the loop over trials, and workers joining it.
"""

from autotune.study.loop import make_tuner, run_study, trial_outcome
from autotune.study.runner import run_configured_trial, score_result, worker_name
from autotune.study.spec import (
    SAMPLERS,
    StudyObserver,
    StudySpec,
    default_study_name,
    prunes,
    run_log_path,
)
from autotune.study.storage import (
    COUNTED_STATES,
    completed_count,
    completed_trials,
    open_storage,
    storage_url,
    stored_run_options,
)

__all__ = [
    "COUNTED_STATES",
    "SAMPLERS",
    "StudyObserver",
    "StudySpec",
    "completed_count",
    "completed_trials",
    "default_study_name",
    "make_tuner",
    "open_storage",
    "prunes",
    "run_configured_trial",
    "run_log_path",
    "run_study",
    "score_result",
    "storage_url",
    "stored_run_options",
    "trial_outcome",
    "worker_name",
]
