"""The default settings propose what they proposed before they moved into a settings
object: a seeded study, measured in-process by the simulator (no noise, no process),
launches the same configs in the same roles as at 6e1cab5, whether the defaults come
from ``TunerSettings()`` or from a settings file that spells every key out."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.config.trial_config import TrialConfig
from autotune.study import StudySpec
from autotune.trial.record import TrialRecord
from autotune.trial.run import TrialResult
from autotune.tuner.settings import TunerSettings
from autotune.tuner.settings_file import read_run_settings
from tests.tuner.conftest import SMALL, run_small_study


def _config(kv: float, mtp: int, lmcache: bool, seqs: int) -> dict:
    return {"kv_cache_memory_gib": kv, "mtp_k": mtp, "lmcache": lmcache, "max_num_seqs": seqs}


# (params, confirms, warm_start) of each trial, printed by the same study at 6e1cab5.
BEFORE = [
    (_config(7.0, 0, False, 2), None, None),  # the baseline
    (_config(7.0, 2, False, 4), None, 1),
    (_config(8.0, 2, True, 4), None, 2),
    (_config(8.0, 1, True, 4), None, 3),
    (_config(8.0, 1, False, 4), None, 4),
    (_config(7.0, 2, False, 4), 1, None),
    (_config(8.0, 2, True, 4), 2, None),
    (_config(7.0, 2, False, 4), 1, None),
]


def _measure(spec: StudySpec, config: TrialConfig, log_path: Path, progress: object) -> TrialResult:
    """The simulator's prediction as the measurement (the benchmark's hook, without noise)."""
    result = TrialResult(config=config)
    result.memory = spec.prescreen(config) if spec.prescreen is not None else None
    assert result.memory is None or result.memory.fits  # the guided search launches no OOM
    assert spec.oracle is not None
    prediction = spec.oracle.predict(config)
    assert prediction is not None
    result.argv = ["sim", *config.vllm_args()]
    result.startup, result.failure = prediction.startup, prediction.failure
    result.server_stats, result.stats = prediction.server_stats, prediction.stats
    return result


def _proposals(tmp_path: Path, settings: TunerSettings) -> list[tuple]:
    study = run_small_study(tmp_path, measure=_measure, settings=settings, trials=8, study="p")
    records = [TrialRecord.read(t.user_attrs) for t in study.trials]
    return [
        (t.params, r.confirms, r.warm_start) for t, r in zip(study.trials, records, strict=True)
    ]


@pytest.mark.timeout(300)
def test_the_defaults_propose_what_they_did_before_the_settings_moved(tmp_path: Path) -> None:
    assert _proposals(tmp_path / "code", TunerSettings(seed=1)) == BEFORE
    spelled_out = tmp_path / "defaults.yaml"
    spelled_out.write_text(yaml.safe_dump(TunerSettings(seed=1).model_dump()))
    from_file = read_run_settings(SMALL, spelled_out).tuner
    assert _proposals(tmp_path / "file", from_file) == BEFORE
