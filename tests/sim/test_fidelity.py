"""The fidelity guard: the simulator's answers on a fixed set of configs and workloads
(tests/sim/fidelity.json, written by scripts/record_fidelity.py) must not move by more
than 0.5% (throughput, TTFT/TPOT/E2E p50 and p95), and KV capacity, completed requests
and failures not at all. A speed-up of the simulator keeps the same answers."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.workload import load_plan

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "record_fidelity.py"
_spec = importlib.util.spec_from_file_location("record_fidelity", SCRIPT)
assert _spec is not None and _spec.loader is not None
recorder = importlib.util.module_from_spec(_spec)
sys.modules["record_fidelity"] = recorder
_spec.loader.exec_module(recorder)

TOLERANCE = 0.005  # relative
EXACT = ("failure", "kv_cache_tokens", "completed")
CASES = json.loads(recorder.FIXTURE.read_text())["cases"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("fidelity")
    builders = recorder.workload_builders()
    return {case["name"]: load_plan(builders[case["name"]](directory)) for case in CASES}


def moved(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """The figures of ``got`` off ``expected`` by more than the guard allows."""
    off = []
    for name, want in expected.items():
        have = got[name]
        if name in EXACT or want is None or have is None:
            if have != want:
                off.append(f"{name}: {have} (recorded {want})")
        elif abs(have - want) > TOLERANCE * abs(want):
            off.append(f"{name}: {have:.6g} (recorded {want:.6g}, {have / want - 1:+.2%})")
    return off


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_predictions_keep_their_recorded_answers(case: dict[str, Any], plans: dict) -> None:
    failures = []
    for entry in case["entries"]:
        got = recorder.figures(entry["sim"], plans[case["name"]], case["load"])
        off = moved(entry["expected"], got)
        if off:
            failures.append(f"{json.dumps(entry['sim'])}: {'; '.join(off)}")
    assert not failures, "\n".join(failures)


def test_the_guard_sees_a_half_percent_move() -> None:
    recorded = CASES[0]["entries"][0]["expected"]
    assert not moved(recorded, dict(recorded))
    nudged = {**recorded, "ttft_p95_s": recorded["ttft_p95_s"] * 1.006}
    assert moved(recorded, nudged) == [
        f"ttft_p95_s: {nudged['ttft_p95_s']:.6g} (recorded {recorded['ttft_p95_s']:.6g}, +0.60%)"
    ]
    assert moved(recorded, {**recorded, "kv_cache_tokens": recorded["kv_cache_tokens"] + 1})
