"""`vllm serve`-style argument parsing for the simulator server.

The parser behaves as vLLM's ``FlexibleArgumentParser`` does where the tuner can
tell: ``_`` and ``-`` are interchangeable in flag names, unique prefixes are
accepted (``--kv-cache-memory=9G``), vLLM's human-readable integers work, and a
bad flag or value prints argparse's usage error on stderr and exits 2 with the
``vllm serve`` program name. Simulator-only options (``--hardware``,
``--time-scale``, ``--noise``, ``--fault-*``) sit beside them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from autotune.catalog.hardware import MAX_TENSOR_PARALLEL_SIZE, get_gpu
from autotune.catalog.models import get_model
from autotune.errors import InputError
from autotune.sim.model.calibration_profile import CalibrationProfile, load_profile
from autotune.sim.model.config import SimConfig
from autotune.sim.model.units import parse_human_int
from autotune.sim.server.faults import FaultConfig
from autotune.workload.hf_tokenizer import load_tokenizer

PROG = "vllm serve"
USAGE = "vllm serve [model_tag] [options]"
DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"  # vLLM binds all interfaces by default; the simulator never does
EMULATED_VLLM_VERSION = "0.33.0"

# vllm/config/cache.py CacheDType (0.33.0); argparse lists them sorted in its error.
KV_CACHE_DTYPES = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "octave_k3v4",
    "octave_k3v3",
    "octave_k3v3_compact",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
)
# vllm/config/speculative.py MTPModelTypes: model-specific names rewritten to "mtp".
MTP_METHODS = frozenset(
    {
        "mtp",
        "deepseek_mtp",
        "mimo_mtp",
        "glm4_moe_mtp",
        "ernie_mtp",
        "qwen3_next_mtp",
        "qwen3_5_mtp",
        "longcat_flash_mtp",
        "pangu_ultra_moe_mtp",
    }
)
LMCACHE_CONNECTORS = frozenset({"LMCacheConnectorV1", "LMCacheMPConnector"})
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
MAMBA_CACHE_MODE_DEPRECATION = (
    "--mamba-cache-mode is deprecated and will be removed in v0.33.0. It has no effect: "
    "Mamba prefix caching follows --enable-prefix-caching."
)


_BINARY_FRACTION = re.compile(r"^\s*(\d+\.\d+)([KMGT])\s*$")


class ServeArgs(BaseModel):
    """A parsed ``serve`` command line: the modelled engine plus the server's own options."""

    model_config = ConfigDict(frozen=True)

    sim: SimConfig
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_keys: tuple[str, ...] = ()
    served_model_name: str
    time_scale: float = 1.0  # wall seconds = modelled seconds / time_scale
    noise: float = 0.0
    faults: FaultConfig = FaultConfig()
    disable_log_stats: bool = False
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE=1: /reset_prefix_cache and friends
    startup_s: float | None = None  # modelled startup time; None: from the model
    vllm_version: str = EMULATED_VLLM_VERSION
    calibration: CalibrationProfile | None = None  # speed constants; None: the defaults
    tokenizer: str | None = None  # the served model's tokenizer.json (None: the BPE estimate)
    non_default_args: dict[str, Any] = {}  # as vLLM logs them ("non-default args: {...}")
    # WARNING lines vLLM's argument handling logs: (file:line, message)
    warnings: tuple[tuple[str, str], ...] = ()


def human_readable_int(text: str) -> int:
    """vLLM's ``human_readable_int``: ``9G`` = 9 GiB, ``9g`` = 9e9, ``25.6k``; plain ints."""
    try:
        return parse_human_int(text)
    except InputError as exc:
        match = _BINARY_FRACTION.match(text)
        if match:
            number, suffix = match.groups()
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean "
                f"to use {number}{suffix.lower()} instead?"
            ) from exc
        # argparse words a ValueError as "invalid human_readable_int value: '...'".
        raise ValueError(text) from exc


def human_readable_int_or_auto(text: str) -> int:
    """``--max-model-len``: a human-readable int, or ``-1``/``auto`` (returned as -1)."""
    if text.strip().lower() in ("auto", "-1"):
        return -1
    return human_readable_int(text)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc.msg}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return {key.replace("-", "_"): item for key, item in value.items()}


def _speculative_config(text: str) -> dict[str, Any]:
    config = _json_object(text)
    method = config.get("method")
    if method is None and "model" not in config:
        raise argparse.ArgumentTypeError(
            "num_speculative_tokens was provided but without speculative model."
        )
    if method not in MTP_METHODS:
        raise argparse.ArgumentTypeError(
            f"Unsupported speculative method: {method!r} (the simulator models MTP only)"
        )
    tokens = config.get("num_speculative_tokens", 1)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise argparse.ArgumentTypeError(
            f"num_speculative_tokens must be an integer >= 1, but got {tokens!r}"
        )
    return config


def _kv_transfer_config(text: str) -> dict[str, Any]:
    config = _json_object(text)
    if config.get("kv_connector") is not None and config.get("kv_role") not in KV_ROLES:
        raise argparse.ArgumentTypeError(
            f"Please specify kv_role when kv_connector is set, supported roles are {list(KV_ROLES)}"
        )
    return config


def _compilation_config(text: str) -> dict[str, Any]:
    config = _json_object(text)
    sizes = config.get("cudagraph_capture_sizes")
    if sizes is not None and (
        not isinstance(sizes, list) or not all(isinstance(size, int) and size > 0 for size in sizes)
    ):
        raise argparse.ArgumentTypeError(
            f"cudagraph_capture_sizes must be a list of positive integers, but got {sizes!r}"
        )
    return config


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], but got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, but got {text}")
    return value


def _positive_int(text: str) -> int:
    value = human_readable_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, but got {text}")
    return value


def _tensor_parallel_size(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_TENSOR_PARALLEL_SIZE:
        raise argparse.ArgumentTypeError(
            f"the simulator models one node of at most {MAX_TENSOR_PARALLEL_SIZE} GPUs, "
            f"but got {text}"
        )
    return value


def _tokenizer_path(text: str) -> str:
    if load_tokenizer(text) is None:
        raise argparse.ArgumentTypeError(
            f"no tokenizer.json found offline for {text!r} (a model directory, a "
            "tokenizer.json or a model name in the Hugging Face cache)"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    """The ``vllm serve`` look-alike parser (vLLM's flags the simulator models)."""
    parser = argparse.ArgumentParser(prog=PROG, usage=USAGE, allow_abbrev=True)
    add = parser.add_argument
    add("model_tag", nargs="?", default=None, help="catalog model name")
    add("--model", default=None, help=argparse.SUPPRESS)
    # Frontend
    add("--host", default=None)
    add("--port", type=int, default=DEFAULT_PORT)
    add("--api-key", nargs="+", default=None)
    add("--served-model-name", nargs="+", default=None)
    add("--disable-log-stats", action="store_true")
    add("--enable-prompt-tokens-details", action=argparse.BooleanOptionalAction, default=False)
    add("--enable-force-include-usage", action=argparse.BooleanOptionalAction, default=False)
    add("--disable-uvicorn-access-log", action="store_true")
    add("--uvicorn-log-level", default="info")
    # Memory and KV cache
    add("--gpu-memory-utilization", type=float, default=None)
    add("--kv-cache-memory-bytes", type=human_readable_int, default=None)
    add("--kv-cache-dtype", choices=sorted(KV_CACHE_DTYPES), default="auto")
    add("--block-size", type=_positive_int, default=None)
    add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    add(
        "--disable-prefix-caching",
        dest="enable_prefix_caching",
        action="store_false",
        default=None,
    )
    add("--mamba-cache-mode", choices=("align", "none"), default=None)
    add("--kv-transfer-config", type=_kv_transfer_config, default=None)
    # Model and scheduler
    add("--max-model-len", type=human_readable_int_or_auto, default=None)
    add("--max-num-seqs", type=_positive_int, default=None)
    add("--max-num-batched-tokens", type=_positive_int, default=None)
    add("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    add("--language-model-only", action=argparse.BooleanOptionalAction, default=False)
    add("--enforce-eager", action=argparse.BooleanOptionalAction, default=False)
    add("-sc", "--speculative-config", type=_speculative_config, default=None)
    add("-cc", "--compilation-config", type=_compilation_config, default=None)
    add("--cudagraph-capture-sizes", type=int, nargs="+", default=None)
    add("--seed", type=int, default=0)
    add("--trust-remote-code", action=argparse.BooleanOptionalAction, default=False)
    add("--tokenizer", type=_tokenizer_path, default=None)
    add("--dtype", default="auto")
    add("-q", "--quantization", default=None)
    add("-tp", "--tensor-parallel-size", type=_tensor_parallel_size, default=1)
    # Simulator only
    sim = parser.add_argument_group("simulator")
    sim.add_argument("--hardware", required=True, help="GPU catalog name")
    sim.add_argument("--time-scale", type=_positive_float, default=1.0)
    sim.add_argument("--noise", type=float, default=0.0)
    sim.add_argument("--startup-s", type=float, default=None)
    sim.add_argument("--emulate-vllm-version", default=EMULATED_VLLM_VERSION)
    sim.add_argument("--calibration", default=None, help="calibration profile (YAML)")
    sim.add_argument("--fault-crash-after-requests", type=int, default=None)
    sim.add_argument("--fault-hang-at-startup", action="store_true")
    sim.add_argument("--fault-5xx-rate", type=_fraction, default=0.0)
    sim.add_argument("--fault-cut-stream-rate", type=_fraction, default=0.0)
    sim.add_argument("--fault-slow-first-token-s", type=float, default=0.0)
    sim.add_argument("--fault-hang-stream-rate", type=_fraction, default=0.0)
    sim.add_argument("--fault-malformed-sse-rate", type=_fraction, default=0.0)
    sim.add_argument("--fault-never-stream", action="store_true")
    sim.add_argument("--fault-gpu-memory-held", type=human_readable_int, default=0)
    sim.add_argument("--fault-env-error", default=None, metavar="NAME")
    return parser


def normalize_argv(argv: list[str]) -> list[str]:
    """``--max_num_seqs=8`` -> ``--max-num-seqs=8``, as FlexibleArgumentParser does."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--"):
            key, sep, value = arg.partition("=")
            out.append(key.replace("_", "-") + sep + value)
        else:
            out.append(arg)
    return out


@functools.cache
def _shared_parser() -> argparse.ArgumentParser:
    """One parser for every parse: building it costs more than parsing (the tuner's
    enumeration parses every config of a space)."""
    return build_parser()


@functools.cache
def _parser_defaults() -> dict[str, Any]:
    """Every destination's default, as ``parse_args`` leaves it when a flag is absent."""
    parser = _shared_parser()
    defaults: dict[str, Any] = {}
    for action in parser._actions:
        if action.dest is argparse.SUPPRESS or action.default is argparse.SUPPRESS:
            continue
        default = action.default
        if isinstance(default, str) and action.type is not None:
            default = action.type(default)
        defaults[action.dest] = default
    return defaults


_FLAG_ACTIONS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)


def _plain_namespace(argv: list[str]) -> argparse.Namespace | None:
    """The namespace ``parse_args`` returns for an argv of whole long flags with valid
    values (what the tuner builds: ``TrialConfig.vllm_args``), without argparse's general
    matching, which costs about a millisecond a parse (the tuner parses every config of
    a lattice); None for anything else (an abbreviation, a bad value, a short flag), which
    ``parse_args`` then parses and words as vLLM does."""
    actions = _shared_parser()._option_string_actions
    values = dict(_parser_defaults())
    positional: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        if not token.startswith("--"):
            if token.startswith("-"):
                return None
            positional.append(token)
            index += 1
            continue
        flag, has_value, value = token.partition("=")
        action = actions.get(flag)
        if action is None:
            return None
        if isinstance(action, argparse._StoreAction) and action.nargs is None:
            if not has_value:
                if index + 1 >= len(argv) or argv[index + 1].startswith("-"):
                    return None
                index += 1
                value = argv[index]
            try:
                converted = action.type(value) if action.type is not None else value
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                return None
            if action.choices is not None and converted not in action.choices:
                return None
            values[action.dest] = converted
        elif isinstance(action, _FLAG_ACTIONS) and not has_value:
            values[action.dest] = action.const
        elif isinstance(action, argparse.BooleanOptionalAction) and not has_value:
            values[action.dest] = not flag.startswith("--no-")
        else:
            return None
        index += 1
    if len(positional) > 1 or values.get("hardware") is None:
        return None
    values["model_tag"] = positional[0] if positional else None
    return argparse.Namespace(**values)


def parse_serve_args(argv: list[str], *, environ: dict[str, str] | None = None) -> ServeArgs:
    """Parse a ``serve`` argv (without ``serve``). Bad input: usage error, exit 2."""
    env = os.environ if environ is None else environ
    parser = _shared_parser()
    normalized = normalize_argv(argv)
    ns = _plain_namespace(normalized) or parser.parse_args(normalized)
    model = ns.model_tag or ns.model
    if model is None:
        parser.error(
            "No model specified! Please specify model either as a positional argument "
            "or in a config file."
        )
    try:
        get_model(model)
        get_gpu(ns.hardware)
    except InputError as exc:
        parser.error(str(exc))
    sizes = _capture_sizes(parser, ns)
    spec = ns.speculative_config or {}
    kv_transfer = ns.kv_transfer_config or {}
    warnings: list[tuple[str, str]] = []
    if ns.mamba_cache_mode is not None:
        warnings.append(("arg_utils.py:462", MAMBA_CACHE_MODE_DEPRECATION))
    if spec.get("method", "mtp") != "mtp":
        message = f"method `{spec['method']}` is deprecated and replaced with mtp."
        warnings.append(("speculative.py:1246", message))
    try:
        sim = SimConfig(
            model=model,
            hardware=ns.hardware,
            kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
            gpu_memory_utilization=(
                0.92 if ns.gpu_memory_utilization is None else ns.gpu_memory_utilization
            ),
            kv_cache_dtype=ns.kv_cache_dtype,
            num_speculative_tokens=spec.get("num_speculative_tokens", 1) if spec else 0,
            max_num_seqs=ns.max_num_seqs,
            max_num_batched_tokens=ns.max_num_batched_tokens,
            max_model_len=None if ns.max_model_len in (None, -1) else ns.max_model_len,
            cudagraph_capture_sizes=sizes,
            enable_prefix_caching=ns.enable_prefix_caching,
            language_model_only=ns.language_model_only,
            lmcache=kv_transfer.get("kv_connector") in LMCACHE_CONNECTORS,
            block_size=ns.block_size,
            enforce_eager=ns.enforce_eager,
            seed=ns.seed,
            tensor_parallel_size=ns.tensor_parallel_size,
        )
        faults = FaultConfig(
            crash_after_requests=ns.fault_crash_after_requests,
            hang_at_startup=ns.fault_hang_at_startup,
            error_5xx_rate=ns.fault_5xx_rate,
            cut_stream_rate=ns.fault_cut_stream_rate,
            slow_first_token_s=ns.fault_slow_first_token_s,
            hang_stream_rate=ns.fault_hang_stream_rate,
            malformed_sse_rate=ns.fault_malformed_sse_rate,
            never_stream=ns.fault_never_stream,
            gpu_memory_held_bytes=ns.fault_gpu_memory_held,
            env_error=ns.fault_env_error,
        )
    except ValidationError as exc:
        parser.error(repr(exc))
    calibration = None
    if ns.calibration is not None:
        try:
            calibration = load_profile(Path(ns.calibration))
            calibration.check_applies(sim)
        except InputError as exc:
            parser.error(str(exc))
    api_keys = tuple(ns.api_key or ([env["VLLM_API_KEY"]] if env.get("VLLM_API_KEY") else []))
    return ServeArgs(
        sim=sim,
        host=ns.host or DEFAULT_HOST,
        port=ns.port,
        api_keys=api_keys,
        served_model_name=(ns.served_model_name or [model])[0],
        time_scale=ns.time_scale,
        noise=ns.noise,
        faults=faults,
        disable_log_stats=ns.disable_log_stats,
        dev_mode=env.get("VLLM_SERVER_DEV_MODE") == "1",
        startup_s=ns.startup_s,
        vllm_version=ns.emulate_vllm_version,
        calibration=calibration,
        tokenizer=ns.tokenizer,
        non_default_args=_non_default_args(ns, model),
        warnings=tuple(warnings),
    )


def _capture_sizes(
    parser: argparse.ArgumentParser, ns: argparse.Namespace
) -> tuple[int, ...] | None:
    from_json = (ns.compilation_config or {}).get("cudagraph_capture_sizes")
    if from_json is not None and ns.cudagraph_capture_sizes is not None:
        parser.error(
            "cudagraph_capture_sizes and compilation_config.cudagraph_capture_sizes are "
            "mutually exclusive"
        )
    sizes = from_json if from_json is not None else ns.cudagraph_capture_sizes
    return None if sizes is None else tuple(sorted(set(sizes)))


_SIM_ONLY = frozenset(
    {
        "hardware",
        "time_scale",
        "noise",
        "startup_s",
        "emulate_vllm_version",
        "calibration",
        "fault_crash_after_requests",
        "fault_hang_at_startup",
        "fault_5xx_rate",
        "fault_cut_stream_rate",
        "fault_slow_first_token_s",
        "fault_hang_stream_rate",
        "fault_malformed_sse_rate",
        "fault_never_stream",
        "fault_gpu_memory_held",
        "fault_env_error",
        "api_key",  # vLLM logs it; we never log keys
    }
)


def _non_default_args(ns: argparse.Namespace, model: str) -> dict[str, Any]:
    """The ``non-default args: {...}`` dict vLLM logs (model_tag first, then the rest)."""
    out: dict[str, Any] = {"model_tag": model}
    defaults = _parser_defaults()
    for key, value in vars(ns).items():
        if key in _SIM_ONLY or key == "model_tag":
            continue
        if value != defaults.get(key):
            out[key] = value
    out["model"] = model
    return out
