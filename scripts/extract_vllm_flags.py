"""Write the `vllm serve` flag list of a vLLM wheel: autotune's known-flag data.

Reads the wheel's source without importing vLLM (no torch needed): every
``add_argument("--...")`` in ``EngineArgs.add_cli_args`` / ``AsyncEngineArgs.add_cli_args``
(vllm/engine/arg_utils.py) and ``make_arg_parser`` (vllm/entrypoints/common/cli_args.py),
plus the fields of ``BaseFrontendArgs`` and ``FrontendArgs``, which that parser turns
into flags one by one. The output is autotune/config/data/vllm-<version>-flags.txt:

    pip download vllm==0.33.0 --no-deps --only-binary :all: -d /tmp/vllm
    python scripts/extract_vllm_flags.py /tmp/vllm/vllm-0.33.0-*.whl > \\
        autotune/config/data/vllm-0.33.0-flags.txt
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import zipfile
from pathlib import Path

ARG_UTILS = "vllm/engine/arg_utils.py"
CLI_ARGS = "vllm/entrypoints/common/cli_args.py"
VERSION_FILE = "vllm/_version.py"
ENGINE_ARG_CLASSES = ("EngineArgs", "AsyncEngineArgs")
FRONTEND_CLASSES = ("BaseFrontendArgs", "FrontendArgs")


def _long_options(node: ast.AST) -> set[str]:
    """The ``--name`` strings of every ``*.add_argument(...)`` call under ``node``."""
    found = set()
    for call in ast.walk(node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        if call.func.attr != "add_argument":
            continue
        for arg in call.args:
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                found.add(str(arg.value)[2:])
    return found


def serve_flags(arg_utils: str, cli_args: str) -> set[str]:
    """The long flags `vllm serve` registers, from the two source files' text."""
    flags: set[str] = set()
    for node in ast.parse(arg_utils).body:
        if isinstance(node, ast.ClassDef) and node.name in ENGINE_ARG_CLASSES:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "add_cli_args":
                    flags |= _long_options(item)
    for node in ast.parse(cli_args).body:
        if isinstance(node, ast.FunctionDef) and node.name == "make_arg_parser":
            flags |= _long_options(node)
        if isinstance(node, ast.ClassDef) and node.name in FRONTEND_CLASSES:
            for item in node.body:  # FrontendArgs.add_cli_args: one --flag per field
                field = item.target if isinstance(item, ast.AnnAssign) else None
                if isinstance(field, ast.Name) and not field.id.startswith("_"):
                    flags.add(field.id.replace("_", "-"))
    return flags


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="a vllm-*.whl file")
    args = parser.parse_args()
    with zipfile.ZipFile(args.wheel) as wheel:
        read = lambda name: wheel.read(name).decode()  # noqa: E731
        version_text = read(VERSION_FILE)
        flags = serve_flags(read(ARG_UTILS), read(CLI_ARGS))
    version = re.search(r"__version__ = (?:version = )?'([^']+)'", version_text)
    commit = re.search(r"__commit_id__ = (?:commit_id = )?'([^']+)'", version_text)
    print(f"# `vllm serve` flags of vLLM {version[1] if version else '?'}", end="")
    print(f" (commit {commit[1]})" if commit else "")
    print(f"# source: {args.wheel.name}, {ARG_UTILS} {'/'.join(ENGINE_ARG_CLASSES)}.add_cli_args,")
    print(f"#   {CLI_ARGS} make_arg_parser and the fields of {'/'.join(FRONTEND_CLASSES)}")
    print("# written by scripts/extract_vllm_flags.py; one flag a line, without the dashes")
    for flag in sorted(flags):
        print(flag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
