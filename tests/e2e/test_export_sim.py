"""`autotune export` of a real simulator study: the model as the user named it, and the
LMCache server its connector needs (chunk size N from the engine's own startup log)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    REPO,
    SAMPLE_WORKLOAD,
    autotune_argv,
    autotune_in_process,
    trial_logs,
    tuner_args,
)

QWEN_SPACE = REPO / "search_spaces" / "qwen3.6-27b-awq.yaml"
USER_MODEL = "/models/Qwen3.6-27B-AWQ"


@pytest.mark.timeout(240)
def test_export_serves_the_users_model_and_starts_the_lmcache_server(tmp_path: Path) -> None:
    """Before: `vllm serve qwen3.6-27b-awq` (the catalog name) with LMCacheMPConnector
    and no LMCache server to connect to; `show` listed the searched batched tokens."""
    space = tmp_path / "lmcache-on.yaml"
    space.write_text(
        QWEN_SPACE.read_text()
        .replace("  mtp_k: 0\n", "  mtp_k: 2\n")
        .replace("  lmcache: false\n", "  lmcache: true\n")
    )
    db = f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}"
    run = subprocess.run(
        autotune_argv(
            "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
            "--hardware", "rtx4080s-32g", "--model", USER_MODEL,
            "--sim-model", "qwen3.6-27b-awq", "--space", str(space), "--storage", db,
            "--trials", "1", "--concurrency", "3",
            *tuner_args(tmp_path / "settings", {
                "warm_start_budget_s": 1,  # the baseline alone: no seed
                "load": {"max_requests": 6}, "simulator": {"time_scale": 200},
            }),
        ),
        cwd=tmp_path, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Best: trial 0" in run.stdout, run.stdout
    logs = trial_logs(tmp_path / "studies" / "runs")
    block = re.search(r"Setting attention block size to (\d+) tokens", logs[0].read_text())
    assert block, "the simulator reports N in its startup log"
    # The trial's line names what it launched with, not the searched value 2N-1 replaced.
    assert f"max_num_batched_tokens={2 * int(block[1]) - 1}* " in run.stdout, run.stdout

    shell = autotune_in_process("export", "--format", "shell", "--storage", db)
    assert shell.returncode == 0, shell.stderr
    commands = [line for line in shell.stdout.splitlines() if not line.startswith("#")]
    assert commands[0] == (
        f"lmcache server --port 5555 --chunk-size {block[1]} --separate-object-groups &"
    )
    serve = shlex.split(commands[1])
    assert serve[:3] == ["vllm", "serve", USER_MODEL]
    assert '"kv_connector":"LMCacheMPConnector"' in commands[1]
    assert serve[serve.index("--max-num-batched-tokens") + 1] == str(2 * int(block[1]) - 1)

    yaml_out = autotune_in_process("export", "--format", "yaml", "--storage", db)
    assert f"model: {USER_MODEL}" in yaml_out.stdout
    assert f"start its server first: lmcache server --port 5555 --chunk-size {block[1]}" in (
        yaml_out.stdout
    )

    show = autotune_in_process("show", "--storage", db)
    assert show.returncode == 0, show.stderr
    # The searched 2,048 was replaced by 2N-1: show lists what was exported.
    launched = f"{2 * int(block[1]) - 1:,}*"
    assert f"max_num_batched_tokens={launched}" in show.stdout, show.stdout
    assert "max_num_batched_tokens=2,048" not in show.stdout
    assert "set by a derived rule" in show.stdout
