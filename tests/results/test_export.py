from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from autotune.cli.results import register
from autotune.config.trial_config import TrialConfig
from autotune.errors import InputError
from autotune.results.export import config_yaml, render, select_trial, shell_command
from autotune.results.reader import load_study

runner = CliRunner()
app = typer.Typer()  # only our commands: the test does not depend on the rest of the CLI
register(app)


def _command_line(text: str) -> str:
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(lines) == 1
    return lines[0]


def test_shell_line_round_trips_to_the_stored_argv(study_url: str) -> None:
    loaded = load_study(study_url)
    best = loaded.best()
    text = render(loaded, best, "shell")
    assert shlex.split(_command_line(text)) == list(best.argv or ())
    assert "# gain over baseline: 2.76x on throughput (+175.9%) vs baseline trial 0" in text
    assert "# hardware: NVIDIA GeForce RTX 4080 SUPER 32GB; engine: sim autotune-sim 0.1.0" in text
    assert "608.0 output tok/s, p95 TTFT 0.800 s" in text


def test_shell_quotes_json_flags_and_prefixes_env() -> None:
    config = TrialConfig(
        model="m",
        flags={"speculative-config": {"method": "mtp", "num_speculative_tokens": 2}},
        env={"VLLM_USE_V1": "1", "NOTE": "a b"},
    )
    line = shell_command(config)
    assert line.startswith("VLLM_USE_V1=1 NOTE='a b' vllm serve m --speculative-config ")
    assert shlex.split(line)[-1] == '{"method":"mtp","num_speculative_tokens":2}'


def test_yaml_keeps_dashed_keys_negated_booleans_and_mappings() -> None:
    config = TrialConfig(
        model="Qwen/Qwen3-0.6B",
        flags={
            "kv-cache-memory-bytes": 9 << 30,
            "enable-prefix-caching": False,
            "kv-cache-dtype": "fp8_e4m3",
            "served-model-name": "true",  # a string YAML would read as a bool unless quoted
            "speculative-config": {"method": "mtp", "num_speculative_tokens": 1},
            "cudagraph-capture-sizes": [1, 2, 4],
            "max-model-len": None,
        },
    )
    document = yaml.safe_load(config_yaml(config))
    assert list(document) == [
        "model",
        "kv-cache-memory-bytes",
        "no-enable-prefix-caching",
        "kv-cache-dtype",
        "served-model-name",
        "speculative-config",
        "cudagraph-capture-sizes",
    ]
    assert document["no-enable-prefix-caching"] is True  # see config_yaml: false is dropped
    assert document["served-model-name"] == "true"
    assert document["speculative-config"] == {"method": "mtp", "num_speculative_tokens": 1}
    assert document["cudagraph-capture-sizes"] == "[1,2,4]"  # as vllm_args() passes it


def test_json_carries_meta_and_measurements(study_url: str) -> None:
    loaded = load_study(study_url)
    document = json.loads(render(loaded, loaded.trial(3), "json"))
    assert document["meta"]["trial"] == 3
    assert document["meta"]["baseline_trial"] == 0
    assert document["meta"]["gain_over_baseline"] == pytest.approx(
        document["replay"]["output_throughput_tok_s"]
        / loaded.trial(0).replay.output_throughput_tok_s
    )
    assert document["config"]["flags"]["speculative-config"]["num_speculative_tokens"] == 1
    assert document["argv"][:3] == ["vllm", "serve", "qwen3.6-27b-awq"]


def test_slo_picks_the_best_trial_that_meets_it(study_url: str, pareto_url: str) -> None:
    loaded = load_study(study_url)
    # trials 7 (608 tok/s) and 3 (562) have 73 and 68.5 ms p95 TPOT; trial 2 (483) has 61
    assert select_trial(loaded, slos=["tpot_p95<=65ms"]).number == 2
    assert select_trial(loaded, slos=["ttft_p95<=1s"]).number == 7
    with pytest.raises(InputError, match="no feasible trial meets tpot_p95<=1ms"):
        select_trial(loaded, slos=["tpot_p95<=1ms"])
    with pytest.raises(InputError, match="--slo 'fast'"):
        select_trial(loaded, slos=["fast"])


def test_cli_writes_a_yaml_config_file(study_url: str, tmp_path: Path) -> None:
    out = tmp_path / "best.yaml"
    result = runner.invoke(
        app, ["export", "--storage", study_url, "--format", "yaml", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    document = yaml.safe_load(out.read_text())
    assert document["model"] == "qwen3.6-27b-awq"
    assert document["kv-cache-memory-bytes"] == 12 << 30
    assert out.read_text().startswith("# run with: vllm serve --config THIS_FILE.yaml\n")


def test_cli_rejects_bad_format_and_conflicting_choices(study_url: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", "--storage", study_url, "--format", "toml"])
    assert result.exit_code == 2
    assert "--format 'toml'" in result.output
    result = runner.invoke(
        app, ["export", "--storage", study_url, "--trial", "2", "--slo", "ttft_p95<=1s"]
    )
    assert result.exit_code == 2
    result = runner.invoke(
        app,
        ["export", "--storage", study_url, "--format", "yaml", "--out", str(tmp_path / "x.txt")],
    )
    assert result.exit_code == 2
    assert "needs a .yaml or .yml file" in result.output
