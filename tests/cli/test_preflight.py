"""The pre-flight check through the real CLI: workload, space, model and hardware are
compared before the first trial; a run that cannot be meaningful exits 2 with no study."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune.cli import app
from tests.e2e.conftest import autotune_argv, tuner_args

REPO = Path(__file__).resolve().parents[2]
QWEN_SPACE = REPO / "search_spaces" / "qwen3.6-27b-awq.yaml"


def autotune(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        autotune_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def in_process(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI app in-process, in ``cwd`` (where the default studies directory would
    go), without an interpreter start: for commands that launch no server."""
    with contextlib.chdir(cwd):
        result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def sim_run(workload: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--workload", str(workload),
        "--engine", "sim",
        "--hardware", "rtx4080s-32g",
        "--model", "qwen3.6-27b-awq",
        *extra,
    ]  # fmt: skip


def fixed_length_space(cwd: Path, max_model_len: int) -> list[str]:
    """``--space`` of the Qwen space with ``max-model-len`` fixed (its ``fixed:`` section)."""
    space = cwd / f"qwen-{max_model_len}.yaml"
    space.write_text(
        QWEN_SPACE.read_text().replace("fixed:\n", f"fixed:\n  max-model-len: {max_model_len}\n")
    )
    return ["--space", str(space)]


NO_VLLM = {"engine": {"vllm_executable": "/nonexistent/vllm"}}


def studies_in(cwd: Path) -> list[str]:
    db = cwd / "studies" / "autotune.db"
    if not db.exists():
        return []
    return [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{db}")]


@pytest.fixture(scope="module")
def claude_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The issue's workload: 4 generated Claude Code sessions, some past 65,536 tokens."""
    path = tmp_path_factory.mktemp("cc") / "cc.jsonl"
    result = autotune(path.parent, "workload", "gen", "claudecode", "--sessions", "4",
                      "--seed", "1", str(path))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return path


@pytest.mark.timeout(300)
def test_generated_claude_code_sessions_tune_to_a_feasible_best(
    tmp_path: Path, claude_code: Path
) -> None:
    """Before: max-model-len 65536 refused 27 of 174 requests; every trial broke the
    error-rate limit and the run ended "No feasible configuration yet"."""
    result = autotune(
        tmp_path,
        # A short warm start: this checks the sizing, not how much of the space is predicted.
        *sim_run(
            claude_code,
            "--trials",
            "2",
            *tuner_args(
                tmp_path / "settings", {"simulator": {"time_scale": 200}, "warm_start_budget_s": 2}
            ),
        ),
        timeout=280,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    sized = re.search(r"max-model-len ([\d,]+): the longest request", out)
    assert sized, out
    assert int(sized[1].replace(",", "")) > 65536
    assert "Every request fits the model's native context (262,144)" in out
    assert "Best: trial" in out
    assert f"--max-model-len {sized[1].replace(',', '')}" in out
    assert "No feasible configuration" not in out


def test_a_fixed_max_model_len_too_short_for_the_workload_exits_2_before_any_study(
    tmp_path: Path, claude_code: Path
) -> None:
    result = in_process(tmp_path, *sim_run(claude_code, *fixed_length_space(tmp_path, 65536)))
    assert result.returncode == 2, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert re.search(r"\d+ of 174 requests are longer than max-model-len 65,536 \(fixed\)", out)
    assert "no trial could be feasible" in out
    assert "workload slice --max-context" in result.stderr
    assert studies_in(tmp_path) == []


def test_requests_within_the_error_allowance_are_reported_and_the_run_goes_on(
    tmp_path: Path, claude_code: Path
) -> None:
    result = autotune(
        tmp_path,
        *sim_run(claude_code, *fixed_length_space(tmp_path, 65536), "--max-error-rate", "0.5",
                 "--trials", "1", *tuner_args(tmp_path / "settings", {
                     "simulator": {"time_scale": 100}, "load": {"max_requests": 5},
                     "warm_start_budget_s": 2,
                 })),
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "They will fail and count as errors" in " ".join(result.stdout.split())
    assert len(studies_in(tmp_path)) == 1


def test_requests_past_the_models_native_context_exit_2(tmp_path: Path) -> None:
    workload = tmp_path / "long.jsonl"
    in_process(tmp_path, "workload", "gen", "fixed", "--requests", "2",
             "--prompt-tokens", "300000", str(workload))  # fmt: skip
    result = in_process(tmp_path, *sim_run(workload))
    assert result.returncode == 2
    assert "2 of 2 requests are longer than the model's native context (262,144)" in " ".join(
        result.stdout.split()
    )
    assert studies_in(tmp_path) == []


def test_requests_past_the_largest_kv_pool_on_this_gpu_exit_2(
    tmp_path: Path, claude_code: Path
) -> None:
    """A space whose KV pool tops out at 2 GiB cannot hold a 90K-token request."""
    small = tmp_path / "small-kv.yaml"
    small.write_text(
        QWEN_SPACE.read_text()
        .replace("low: 6.0\n    high: 13.0", "low: 1.0\n    high: 2.0")
        .replace("kv_cache_memory_gib: 9.0", "kv_cache_memory_gib: 1.5")
    )
    result = in_process(tmp_path, *sim_run(claude_code, "--space", str(small)))
    assert result.returncode == 2, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert re.search(r"\d+ of 174 requests are longer than the largest KV pool the space "
                     r"allows on rtx4080s-32g \(kv_cache_memory_gib=2\.0", out)  # fmt: skip
    assert studies_in(tmp_path) == []


def test_an_endpoint_the_engine_does_not_serve_exits_2(tmp_path: Path) -> None:
    """A local model without a chat template: vLLM serves completions only."""
    model = tmp_path / "no-template"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    (model / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    workload = tmp_path / "chat.jsonl"
    in_process(tmp_path, "workload", "gen", "fixed", "--requests", "4", str(workload))
    result = in_process(tmp_path, "run", "--workload", str(workload), "--engine", "vllm",
                      "--model", str(model), *tuner_args(tmp_path, NO_VLLM))  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    assert "4 requests use openai.chat, which vllm does not serve" in out
    assert studies_in(tmp_path) == []


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--model", "qwen3-27b"], "unknown model 'qwen3-27b'"),
        (["--model", "qwen3.6-27b-awq", "--hardware", "rtx4080"], "rtx4080"),
    ],
)
def test_an_unknown_model_or_gpu_on_the_simulator_exits_2_with_the_known_names(
    tmp_path: Path, claude_code: Path, args: list[str], named: str
) -> None:
    """Before: `--model qwen3-27b` made every trial invalid-args, exit 0, a junk study."""
    argv = ["run", "--workload", str(claude_code), "--engine", "sim", "--trials", "1"]
    if "--hardware" not in args:
        argv += ["--hardware", "rtx4080s-32g"]
    result = in_process(tmp_path, *argv, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert named in result.stderr
    assert "qwen3.6-27b-awq" in result.stderr or "rtx4080s-32g" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert studies_in(tmp_path) == []


def test_an_unknown_sim_model_for_a_real_engine_exits_2(tmp_path: Path, claude_code: Path) -> None:
    """Before: a typo in --sim-model silently turned the memory pre-screen off."""
    result = in_process(tmp_path, "run", "--workload", str(claude_code), "--engine", "vllm",
                      "--model", "Qwen/Qwen3.6-27B", "--sim-model", "qwen3-27b",
                      *tuner_args(tmp_path, NO_VLLM))  # fmt: skip
    assert result.returncode == 2
    assert "unknown model 'qwen3-27b'" in result.stderr
    assert studies_in(tmp_path) == []


@pytest.mark.timeout(300)
def test_the_advised_max_context_slices_to_a_workload_the_preflight_accepts(
    tmp_path: Path, claude_code: Path
) -> None:
    """Before: the advice said "--max-context N"; the value a user guessed could keep
    nothing. Now it names the value, the slice keeps what it says, and the run starts."""
    refused = in_process(tmp_path, *sim_run(claude_code, *fixed_length_space(tmp_path, 65536)))
    assert refused.returncode == 2
    advice = re.search(
        r"workload slice --max-context (\d+) keeps (\d+) of the (\d+) that can run", refused.stderr
    )
    assert advice, refused.stderr
    value, keeps, runnable = (int(group) for group in advice.groups())
    assert 0 < keeps <= runnable < 174
    sliced = tmp_path / "sliced.jsonl"
    cut = in_process(tmp_path, "workload", "slice", str(claude_code), str(sliced),
                     "--max-context", str(value))  # fmt: skip
    assert cut.returncode == 0, cut.stdout + cut.stderr
    assert f"kept {keeps} requests" in cut.stdout
    result = autotune(
        tmp_path,
        *sim_run(sliced, *fixed_length_space(tmp_path, 65536), "--trials", "1",
                 *tuner_args(tmp_path, {"warm_start_budget_s": 2.0, "load": {"max_requests": 2},
                                        "simulator": {"time_scale": 200}})),
        timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Every request fits max-model-len 65,536 (fixed)." in " ".join(result.stdout.split())


def test_when_no_request_fits_the_advice_is_not_to_slice(tmp_path: Path) -> None:
    workload = tmp_path / "long.jsonl"
    in_process(tmp_path, "workload", "gen", "fixed", "--requests", "2",
               "--prompt-tokens", "300000", str(workload))  # fmt: skip
    result = in_process(tmp_path, *sim_run(workload))
    assert result.returncode == 2
    assert "no request fits the model's native context (262,144): the shortest needs " in (
        result.stderr
    )
    assert "slicing cannot help" in result.stderr and "--max-context" not in result.stderr


def test_the_trial_limit_line_says_why_nothing_was_predicted_when_both_names_were_given(
    tmp_path: Path,
) -> None:
    """Before: "--hardware and --sim-model let the simulator predict it" when both were
    given (--gpus-per-trial 2 turns the one-GPU simulator off)."""
    workload = REPO / "workloads" / "sample-claudecode.jsonl"
    done = in_process(
        tmp_path, "run", "--workload", str(workload), "--engine", "vllm",
        "--model", "Qwen/Qwen3.6-27B", "--sim-model", "qwen3.6-27b-awq",
        "--hardware", "h200-141g", "--gpus", "0,1", "--gpus-per-trial", "2",
        "--storage", f"sqlite:///{tmp_path / 'a.db'}",
        *tuner_args(tmp_path, {"engine": {"vllm_executable": "/bin/false"}}),
    )  # fmt: skip
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("Trial time limit")]
    assert "the simulator models one GPU, not --gpus-per-trial above 1" in line, line
    assert "let the simulator predict it" not in line
