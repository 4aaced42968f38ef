"""Speed constants as a value and calibration profiles: threading, defaults, files."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.sim.model.calibration_profile import CalibrationProfile, load_profile, save_profile
from autotune.sim.model.speed_constants import SpeedConstants
from autotune.sim.server.flags import parse_serve_args
from autotune.sim.virtual.predict import predict
from autotune.sim.virtual.sweep import baseline_config
from autotune.workload.expand import expand
from autotune.workload.gen import fixed

QWEN = baseline_config("rtx4080s-32g", "qwen3.6-27b-awq", num_speculative_tokens=2)
PLAN = expand(fixed(requests=8, prompt_tokens=128, output_tokens=64))
LOAD = LoadSpec(mode="concurrency", concurrency=2)


def _tok_s(calibration: CalibrationProfile | None) -> float:
    prediction = predict(QWEN, PLAN, LOAD, calibration=calibration)
    assert prediction.failure is None
    return prediction.stats.output_throughput_tok_s


def test_default_constants_change_nothing() -> None:
    plain = predict(QWEN, PLAN, LOAD)
    profiled = predict(QWEN, PLAN, LOAD, calibration=CalibrationProfile())
    assert profiled.stats == plain.stats
    assert plain.expected_error is None and profiled.expected_error is None


def test_each_constant_moves_the_prediction_its_way() -> None:
    base = _tok_s(None)
    slower_memory = SpeedConstants(bandwidth_efficiency=0.45)
    assert _tok_s(CalibrationProfile(constants=slower_memory)) < 0.7 * base
    costly_steps = SpeedConstants(step_overhead_s=20e-3)
    assert _tok_s(CalibrationProfile(constants=costly_steps)) < 0.8 * base
    costly_drafts = SpeedConstants(draft_pass_overhead_s=10e-3)
    assert _tok_s(CalibrationProfile(constants=costly_drafts)) < 0.8 * base


def test_profile_acceptance_overrides_the_catalog() -> None:
    unsure = CalibrationProfile(constants=SpeedConstants(mtp_acceptance=(0.3, 0.1)))
    prediction = predict(QWEN, PLAN, LOAD, calibration=unsure)
    length = prediction.server_stats.spec_decode_mean_acceptance_length
    assert length is not None and length < 1.6
    plain = predict(QWEN, PLAN, LOAD).server_stats.spec_decode_mean_acceptance_length
    assert plain is not None and plain > 2.4  # catalog (0.924, 0.788): about 2.7


def test_profile_round_trips_and_reports_its_error(tmp_path: Path) -> None:
    profile = CalibrationProfile(
        hardware="rtx4080s-32g",
        model="qwen3.6-27b-awq",
        constants=SpeedConstants(step_overhead_s=2e-3, mtp_acceptance=(0.9, 0.8)),
        fitted=["step_overhead_s"],
        expected_error=0.04,
    )
    path = tmp_path / "profile.yaml"
    save_profile(profile, path)
    loaded = load_profile(path)
    assert loaded.model_dump() == profile.model_dump()
    assert loaded.name == str(path)
    assert predict(QWEN, PLAN, LOAD, calibration=profile).expected_error == 0.04


def test_profile_for_another_gpu_is_refused() -> None:
    other = CalibrationProfile(hardware="h100-80g", source="h100.yaml")
    with pytest.raises(InputError, match=r"h100\.yaml was fitted for hardware 'h100-80g'"):
        predict(QWEN, PLAN, LOAD, calibration=other)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("constants:\n  bandwidth_efficiency: 1.5\n", "constants.bandwidth_efficiency"),
        ("constants:\n  warp_speed: 2\n", "constants.warp_speed"),
        ("version: 7\n", "version: profile version 7"),
        ("constants: [1\n", "not YAML"),
    ],
)
def test_bad_profile_names_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as excinfo:
        load_profile(path)
    assert str(excinfo.value).startswith(str(path))
    assert "\n" not in str(excinfo.value)


def test_sim_serve_takes_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "profile.yaml"
    save_profile(CalibrationProfile(constants=SpeedConstants(step_overhead_s=3e-3)), path)
    argv = ["qwen3.6-27b-awq", "--hardware", "rtx4080s-32g", "--calibration", str(path)]
    args = parse_serve_args(argv)
    assert args.calibration is not None
    assert args.calibration.constants.step_overhead_s == 3e-3
    assert "calibration" not in args.non_default_args
    assert parse_serve_args(argv[:3]).calibration is None
    with pytest.raises(SystemExit) as excinfo:
        parse_serve_args([*argv[:3], "--calibration", str(tmp_path / "missing.yaml")])
    assert excinfo.value.code == 2
    assert "missing.yaml: cannot read calibration profile" in capsys.readouterr().err


def test_request_overhead_ends_each_request_later_not_its_first_token() -> None:
    one = LoadSpec(mode="concurrency", concurrency=1)
    plain = predict(QWEN, PLAN, one)
    slow_api = CalibrationProfile(constants=SpeedConstants(request_overhead_s=0.5))
    later = predict(QWEN, PLAN, one, calibration=slow_api)
    assert later.stats.e2e.mean == pytest.approx(plain.stats.e2e.mean + 0.5, rel=1e-6)
    assert later.stats.ttft.mean == pytest.approx(plain.stats.ttft.mean, rel=1e-6)
    assert later.stats.output_throughput_tok_s < plain.stats.output_throughput_tok_s


def test_host_output_stage_paces_steps_only_once_it_is_the_slower_stage() -> None:
    """Per streamed chunk host work runs beside the engine: a floor, not an addition."""
    tiny = baseline_config(
        "cpu-2c", "tiny-qwen2", enforce_eager=True, max_model_len=1024,
        kv_cache_memory_bytes=256 << 20,
    )  # fmt: skip
    plan = expand(fixed(requests=16, prompt_tokens=64, output_tokens=64))
    host = CalibrationProfile(constants=SpeedConstants(host_per_output_s=0.5e-3))

    def tpot(clients: int, calibration: CalibrationProfile | None) -> float:
        load = LoadSpec(mode="concurrency", concurrency=clients)
        prediction = predict(tiny, plan, load, calibration=calibration)
        assert prediction.failure is None and prediction.stats.tpot.mean is not None
        return prediction.stats.tpot.mean

    engine_1 = tpot(1, None)
    assert engine_1 > 0.5e-3  # one sequence: the engine's step is the slower stage
    assert tpot(1, host) == pytest.approx(engine_1, rel=1e-6)
    # Eight sequences: 8 x 0.5 ms of host work per step exceeds the engine's step.
    assert tpot(8, None) < 4e-3
    assert tpot(8, host) == pytest.approx(4e-3, rel=0.02)
