"""The warm start's predictions kept on disk and in the study: the same values as the
serial, uncached path, a miss whenever an input changes, safe with several writers."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import optuna
import pytest

from autotune.replay.load import LoadSpec
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.study import StudySpec
from autotune.study.setup import RunOptions, prepare_study
from autotune.trial.objective import Goal, Score, parse_objectives, parse_slos
from autotune.tuner.guide import build_guide
from autotune.tuner.lattice import enumerate_effective
from autotune.tuner.prediction_cache import (
    PACKAGE,
    STUDY_ATTR,
    CachedPredictions,
    PredictionStore,
    code_digest,
    encode_score,
    files_digest,
    oracle_digest,
    read_stored,
)
from autotune.tuner.predictor import SimOracle
from autotune.workload import load_plan
from tests.tuner.conftest import DATA

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "workloads" / "sample-claudecode.jsonl"
LOAD = LoadSpec(concurrency=4, max_requests=10)


@pytest.fixture(scope="module")
def spec() -> StudySpec:
    """`autotune run`'s setup over a space of 112 launches (worker processes predict it)."""
    return prepare_study(
        RunOptions(
            workload=SAMPLE,
            engine="sim",
            model="qwen3.6-27b-awq",
            hardware="rtx4080s-32g",
            space=DATA / "warm-start.yaml",
            storage="sqlite:///:memory:",
            slos=["ttft_p95<=20s"],
            load=LOAD,
        )
    )


@pytest.fixture(scope="module")
def serial(spec: StudySpec) -> dict[str, Score | None]:
    """Each candidate predicted alone, in this process, with no cache: the reference."""
    candidates = enumerate_effective(
        spec.space, model=spec.model, engine_version=None, prescreen=spec.prescreen
    )
    assert spec.oracle is not None
    return {c.key: spec.oracle.score(c.config) for c in candidates if c.memory.fits}


def guide(spec: StudySpec, cache) -> object:
    return build_guide(
        spec.space,
        model=spec.model,
        engine_version=None,
        prescreen=spec.prescreen,
        oracle=spec.oracle,
        maximize=True,
        cache=cache,
    )


def as_json(score: Score | None) -> str:
    return json.dumps(encode_score(score))


def test_cached_predictions_are_the_serial_uncached_ones_to_the_bit(
    spec: StudySpec, serial: dict, tmp_path: Path
) -> None:
    disk = tmp_path / "predictions.sqlite"
    cold = CachedPredictions(spec.oracle, disk=disk)
    first = guide(spec, cold)  # worker processes predict, the cache writes them down
    cold.close()
    assert len(first.candidates) == len(serial) > 64 and first.cached == 0
    warm = CachedPredictions(spec.oracle, disk=disk)  # another run: nothing in memory
    second = guide(spec, warm)
    # The cache holds replays (the screen's short list): the second run replays none.
    replayed = first.replayed
    assert second.cached == replayed and warm.hits == {"study": 0, "disk": replayed}
    assert second.replayed_now == 0
    for candidate, scored, screened in zip(
        second.candidates, second.scores, second.screened, strict=True
    ):
        if not screened:
            reference = serial[candidate.key]
            assert scored == reference and as_json(scored) == as_json(reference)
    np.testing.assert_array_equal(first.utility, second.utility)


def test_the_parallel_cached_warm_start_ranks_as_the_serial_one(
    spec: StudySpec, serial: dict, tmp_path: Path
) -> None:
    parallel = guide(spec, CachedPredictions(spec.oracle, disk=tmp_path / "p.sqlite"))
    reference = guide(spec, dict(serial))  # every prediction given: nothing predicted
    assert reference.cached == len(serial)
    assert [c.key for c in parallel.candidates] == [c.key for c in reference.candidates]
    replayed = ~parallel.screened  # the short list: replayed in worker processes
    assert replayed.sum() == parallel.replayed > 0
    np.testing.assert_array_equal(parallel.utility[replayed], reference.utility[replayed])


def changed_oracles(oracle: SimOracle, tmp_path: Path) -> dict[str, SimOracle]:
    """``oracle`` with one input changed at a time (the flags are the entry's own key)."""
    other_workload = tmp_path / "other.jsonl"
    lines = SAMPLE.read_text().splitlines()
    other_workload.write_text("\n".join(lines[:-1]) + "\n")
    faster = oracle.calibration or CalibrationProfile(source="test")
    faster = faster.model_copy(
        update={"constants": faster.constants.model_copy(update={"bandwidth_efficiency": 0.5})}
    )
    return {
        "workload": dataclasses.replace(oracle, plan=load_plan(other_workload)),
        "load": dataclasses.replace(oracle, load=LoadSpec(concurrency=5, max_requests=10)),
        "slo": dataclasses.replace(
            oracle,
            goal=Goal(objectives=parse_objectives("throughput"), slos=parse_slos(["ttft_p95<=9s"])),
        ),
        "objective": dataclasses.replace(
            oracle,
            goal=Goal(objectives=parse_objectives("goodput"), slos=oracle.goal.slos),
        ),
        "calibration": dataclasses.replace(oracle, calibration=faster),
        "seed": dataclasses.replace(oracle, seed=oracle.seed + 1),
        "hardware": dataclasses.replace(oracle, hardware="rtx4090-24g"),
        "model": dataclasses.replace(oracle, sim_model="llama-3.1-8b"),
    }


def test_a_changed_input_misses_the_cache(spec: StudySpec, tmp_path: Path) -> None:
    disk = tmp_path / "predictions.sqlite"
    assert spec.oracle is not None
    candidate = enumerate_effective(
        spec.space, model=spec.model, engine_version=None, prescreen=spec.prescreen
    )[0]
    written = CachedPredictions(spec.oracle, disk=disk)
    written[candidate.key] = spec.oracle.score(candidate.config)
    written.close()
    again = CachedPredictions(spec.oracle, disk=disk)
    assert candidate.key in again  # the same inputs hit
    assert "another launch key" not in again  # other flags miss
    again.close()
    changed = changed_oracles(spec.oracle, tmp_path)
    digests = {name: oracle_digest(oracle) for name, oracle in changed.items()}
    assert len(set(digests.values()) | {oracle_digest(spec.oracle)}) == len(changed) + 1
    for name, oracle in changed.items():
        other = CachedPredictions(oracle, disk=disk)
        assert candidate.key not in other, f"a changed {name} read the old prediction"
        other.close()


def test_the_code_digest_covers_every_file_of_the_package(tmp_path: Path) -> None:
    copy = tmp_path / "autotune"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert files_digest(copy) == code_digest()  # content, not location
    for edited in ("sim/model/timing.py", "catalog/data/gpus.yaml", "replay/load_policy.py"):
        path = copy / edited
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        assert files_digest(copy) != code_digest(), edited
        path.write_bytes(original)


def test_a_study_stores_its_warm_start_and_a_resume_reads_it_without_the_disk(
    spec: StudySpec, serial: dict, tmp_path: Path
) -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'studies.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    first_cache = CachedPredictions(spec.oracle)  # no disk cache at all
    first = guide(spec, first_cache)
    assert first_cache.store(study, [c.key for c in first.candidates])
    assert not first_cache.store(study, [c.key for c in first.candidates])  # nothing new
    stored = read_stored(storage, "s")
    assert stored is not None and len(stored.entries) == first.replayed  # the replays
    assert len(json.dumps(study.user_attrs[STUDY_ATTR])) < 100_000  # compressed
    resumed_cache = CachedPredictions(spec.oracle, stored=stored)
    resumed = guide(spec, resumed_cache)
    assert resumed.cached == first.replayed == resumed_cache.hits["study"]
    assert resumed.replayed_now == 0  # the resume replays nothing
    assert [
        s for s, screened in zip(resumed.scores, resumed.screened, strict=True) if not screened
    ] == [
        serial[c.key]
        for c, screened in zip(resumed.candidates, resumed.screened, strict=True)
        if not screened
    ]
    # Stored under other inputs (another simulator version, say): not used.
    other = dataclasses.replace(spec.oracle, seed=9)
    stale = CachedPredictions(other, stored=stored)
    replayed = next(c.key for c, s in zip(first.candidates, first.screened, strict=True) if not s)
    assert stale.stale_stored == first.replayed and replayed not in stale
    assert read_stored(storage, "no such study") is None


def _write_entries(path: str, start: int) -> None:
    store = PredictionStore(Path(path))
    for batch in range(20):
        keys = range(start + 10 * batch, start + 10 * (batch + 1))
        store.put_many((f"k{key}", Score([float(key)], {"oom": -1.0}, "ok")) for key in keys)
    store.close()


def test_several_processes_write_one_cache_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "predictions.sqlite"
    PredictionStore(path).close()
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_entries, args=(str(path), n * 1000)) for n in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
        assert writer.exitcode == 0
    store = PredictionStore(path)
    assert len(store) == 600
    assert store.get("k2057") == (True, Score([2057.0], {"oom": -1.0}, "ok"))
    store.close()


def test_the_disk_cache_keeps_the_newest_entries(tmp_path: Path) -> None:
    store = PredictionStore(tmp_path / "predictions.sqlite", max_entries=100)
    for batch in range(5):
        store.put_many((f"b{batch}-{i}", None) for i in range(40))
    assert len(store) <= 100
    assert store.get("b4-39") == (True, None) and store.get("b0-0") == (False, None)
    store.close()


@pytest.mark.parametrize("broken", ["not a database", "under a file"])
def test_a_cache_that_cannot_be_used_is_switched_off_and_the_run_predicts(
    spec: StudySpec, serial: dict, tmp_path: Path, broken: str
) -> None:
    disk = tmp_path / "predictions.sqlite"
    disk.write_bytes(b"not a database " * 100)
    if broken == "under a file":  # its folder cannot be made
        disk = disk / "predictions.sqlite"
    cache = CachedPredictions(spec.oracle, disk=disk)
    found = guide(spec, cache)
    assert cache.problem is not None and str(disk) in cache.problem
    replayed = [
        c for c, screened in zip(found.candidates, found.screened, strict=True) if not screened
    ]
    assert len(replayed) == found.replayed > 0
    assert [found.scores[found.by_key[c.key]] for c in replayed] == [
        serial[c.key] for c in replayed
    ]
    cache.close()
    with pytest.raises((sqlite3.DatabaseError, OSError)):  # the file is left as it was
        PredictionStore(disk)
