"""Search spaces: schema validation, derived flags, rules, gates and the Optuna mapping."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.config.derive import capture_sizes
from autotune.config.space import SEARCH_SPACES_DIR, default_space_path, load_space
from autotune.errors import SpaceError

QWEN = SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml"


def test_shipped_spaces_validate_and_their_baselines_obey_their_rules() -> None:
    for path in sorted(SEARCH_SPACES_DIR.glob("*.yaml")):
        space = load_space(path)
        baseline = space.baseline_params()
        assert set(baseline) == set(space.parameters), path
        assert space.rule_violations(baseline) == [], path


def test_qwen_space_encodes_the_field_notes() -> None:
    space = load_space(QWEN)
    kv = space.parameters["kv_cache_memory_gib"]
    assert (kv.low, kv.high) == (6.0, 13.0)
    assert space.parameters["kv_cache_dtype"].choices == ["auto", "fp8_e4m3", "fp8_e5m2"]
    assert (space.parameters["mtp_k"].low, space.parameters["mtp_k"].high) == (0, 3)
    assert space.fixed["language-model-only"] is True
    assert space.fixed["enable-prefix-caching"] is True


def test_derived_flags_follow_mtp_lmcache_and_max_num_seqs() -> None:
    space = load_space(QWEN)
    params = space.baseline_params() | {"max_num_seqs": 8, "mtp_k": 2, "lmcache": True}
    config = space.to_config(params, model="m", engine_version="0.26.0", attention_block_size=544)
    flags = config.flags
    assert flags["kv-cache-memory-bytes"] == 9 * 2**30
    assert flags["speculative-config"] == {"method": "mtp", "num_speculative_tokens": 2}
    # field notes: 8 sequences with MTP 2 -> [1, 2, 4, 8, 16, 24]
    assert flags["compilation-config"] == {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24]}
    assert flags["kv-transfer-config"]["kv_connector"] == "LMCacheMPConnector"
    assert flags["max-num-batched-tokens"] == 2 * 544 - 1
    assert flags["mamba-cache-mode"] == "align"  # still needed before 0.33

    newer = space.to_config(params, model="m", engine_version="0.33.0", attention_block_size=544)
    assert "mamba-cache-mode" not in newer.flags  # gated: a no-op from 0.33

    off = space.to_config(params | {"mtp_k": 0, "lmcache": False}, model="m")
    assert "speculative-config" not in off.flags
    assert "kv-transfer-config" not in off.flags
    assert off.flags["max-num-batched-tokens"] == params["max_num_batched_tokens"]
    assert off.flags["compilation-config"] == {"cudagraph_capture_sizes": [1, 2, 4, 8]}


def test_argv_renders_booleans_json_and_order() -> None:
    space = load_space(QWEN)
    argv = space.to_config(space.baseline_params(), model="qwen").vllm_args()
    assert argv[0] == "qwen"
    assert "--language-model-only" in argv
    index = argv.index("--compilation-config")
    assert argv[index + 1] == '{"cudagraph_capture_sizes":[1,2,4,8]}'


@pytest.mark.parametrize(
    ("max_batch", "expected"),
    [
        (1, [1]),
        (3, [1, 2, 3]),
        (8, [1, 2, 4, 8]),
        (24, [1, 2, 4, 8, 16, 24]),
        (20, [1, 2, 4, 8, 16, 20]),
    ],
)
def test_capture_sizes(max_batch: int, expected: list[int]) -> None:
    assert capture_sizes(max_batch) == expected


def test_rules_reject_configs() -> None:
    space = load_space(QWEN)
    params = space.baseline_params() | {"max_num_seqs": 64, "max_num_batched_tokens": 32}
    assert space.rule_violations(params) == ["max_num_batched_tokens >= max_num_seqs"]


def test_suggest_is_static_and_inside_the_ranges() -> None:
    space = load_space(QWEN)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(5):
        trial = study.ask()
        params = space.suggest(trial)
        assert set(params) == set(space.parameters)
        assert 6.0 <= params["kv_cache_memory_gib"] <= 13.0
        study.tell(trial, 0.0)


def test_version_gate_removes_a_choice(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\nparameters:\n  kv:\n    type: categorical\n"
        "    choices: [auto, turboquant_4bit_nc]\n    flag: kv-cache-dtype\n"
        "gates:\n  - param: kv\n    choice: turboquant_4bit_nc\n"
        "    versions: '<0.26'\n"
    )
    space = load_space(path)
    assert space.distributions("0.24.1")["kv"].choices == ("auto", "turboquant_4bit_nc")
    assert space.distributions("0.26.0")["kv"].choices == ("auto",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "name: s\nparameters:\n  a:\n    type: int\n    low: 1\n    high: 2\n    colour: red\n",
            "s.yaml:7: parameters.a.int.colour: Extra inputs are not permitted",
        ),
        (
            "name: s\nparameters:\n  a:\n    type: int\n    low: 5\n    high: 2\n",
            "low must be <= high",
        ),
        ("name: s\nparameters: {}\nderived: [nope]\n", "unknown derived rule 'nope'"),
        ("name: s\nparameters: {}\nrules: ['x > 1']\n", "unknown parameter 'x'"),
        ("name: s\nparameters:\n  a: [\n", "not valid YAML"),
    ],
)
def test_bad_space_files_get_one_line_naming_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError) as info:
        load_space(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_default_space_per_model() -> None:
    assert default_space_path("qwen3.6-27b-awq") == QWEN
    assert default_space_path("/models/Some-Other-Model") == SEARCH_SPACES_DIR / "default.yaml"
