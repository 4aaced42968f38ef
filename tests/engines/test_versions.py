from __future__ import annotations

import pytest

from autotune.engines.versions import gate_flags, kv_cache_dtypes, parse_version
from autotune.errors import EngineError


def test_local_and_prefixed_versions_parse():
    assert parse_version("0.32.0+cpu").release == (0, 32, 0)
    assert parse_version("v0.33.0").release == (0, 33, 0)
    with pytest.raises(EngineError, match="not an engine version"):
        parse_version("autotune-sim 0.1.0")


def test_kv_dtype_choices_differ_by_version():
    assert "octave_k3v4" in kv_cache_dtypes("0.33.0")
    assert "octave_k3v4" not in kv_cache_dtypes("0.32.0+cpu")
    assert "nvfp4" in kv_cache_dtypes("0.32.0+cpu")
    assert "turboquant_4bit_nc" not in kv_cache_dtypes("0.26.0")  # broken there
    assert kv_cache_dtypes("0.10.0") == {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}


def test_mamba_cache_mode_dropped_where_it_does_nothing():
    flags = {"max-num-seqs": 8, "mamba-cache-mode": "align", "enable-prefix-caching": True}
    gated, notes = gate_flags(flags, "0.33.0")
    assert list(gated) == ["max-num-seqs", "enable-prefix-caching"]
    assert len(notes) == 1 and "mamba-cache-mode" in notes[0]
    kept, none = gate_flags(flags, "0.32.0+cpu")
    assert kept == flags and none == []


def test_kv_cache_memory_bytes_only_on_newer_versions():
    flags = {"kv-cache-memory-bytes": "9G", "max-num-seqs": 8}
    gated, notes = gate_flags(flags, "0.10.1")
    assert gated == {"max-num-seqs": 8}
    assert "kv-cache-memory-bytes" in notes[0]
    assert gate_flags(flags, "0.33.0") == (flags, [])


def test_kv_dtype_rewritten_or_dropped():
    gated, notes = gate_flags({"kv-cache-dtype": "octave_k3v3"}, "0.32.0")
    assert gated == {}
    assert "not accepted by vLLM 0.32.0" in notes[0]
    gated, notes = gate_flags({"kv-cache-dtype": "turboquant_4bit_nc"}, "0.26.1")
    assert gated == {}
    assert "broken on vLLM 0.26" in notes[0]
    assert gate_flags({"kv-cache-dtype": "fp8_e4m3"}, "0.26.1") == (
        {"kv-cache-dtype": "fp8_e4m3"},
        [],
    )


def test_unset_gated_flag_is_left_alone():
    assert gate_flags({"mamba-cache-mode": None}, "0.33.0") == ({"mamba-cache-mode": None}, [])
