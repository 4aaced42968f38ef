"""Default MTP acceptance follows the workload's kind: agent traffic accepts more than chat."""

from __future__ import annotations

from autotune.replay.load import LoadSpec
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.speed_constants import SpeedConstants
from autotune.sim.virtual.predict import predict, workload_kind
from autotune.sim.virtual.sweep import baseline_config
from autotune.workload.expand import expand
from autotune.workload.gen import ChatParams, ClaudeCodeParams, chat, claudecode, fixed

QWEN = baseline_config(
    "rtx4080s-32g", "qwen3.6-27b-awq", num_speculative_tokens=3, max_model_len=65536
)
AGENT = expand(claudecode(ClaudeCodeParams(sessions=2, user_turns=1, requests_per_session=3)))
CHAT = expand(chat(ChatParams(requests=4, prompt_tokens_median=200, output_tokens_median=100)))
LOAD = LoadSpec(mode="concurrency", concurrency=2, max_requests=4)


def _length(config, plan, calibration=None) -> float:
    prediction = predict(config, plan, LOAD, calibration=calibration)
    assert prediction.failure is None
    length = prediction.server_stats.spec_decode_mean_acceptance_length
    assert length is not None
    return length


def test_kinds_of_workloads() -> None:
    assert workload_kind(AGENT) == "agent"
    assert workload_kind(CHAT) == "chat"
    assert workload_kind(expand(fixed(requests=2, prompt_tokens=8, output_tokens=8))) is None


def test_agent_traffic_accepts_more_drafts_than_chat() -> None:
    agent, prose = _length(QWEN, AGENT), _length(QWEN, CHAT)
    assert agent > 3.0  # 1 + 0.924 + 0.788 + 0.652 = 3.36
    assert prose < 2.8  # 1 + 0.72 + 0.5 + 0.35 = 2.57


def test_explicit_and_calibrated_acceptance_win_over_the_kind() -> None:
    given = QWEN.model_copy(update={"mtp_acceptance": (0.3, 0.1, 0.05)})
    assert _length(given, AGENT) < 1.7
    calibrated = CalibrationProfile(constants=SpeedConstants(mtp_acceptance=(0.3, 0.1, 0.05)))
    assert _length(QWEN, AGENT, calibrated) < 1.7
