"""A space's flags are checked before anything runs: a secret in any spelling, a flag the
engine does not take. One line naming the file, line and field; exit 2; nothing stored."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config.known_flags import sim_flags, vllm_flags
from autotune.config.space import check_flags, load_space
from autotune.errors import SpaceError
from tests.e2e.conftest import tuner_args

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
SECRET = "sk-autotune-secret-0f9e8d7c6b5a"
SHARED = Path(os.environ.get("AUTOTUNE_SHARED_DATA", REPO.parent / "shared" / "data"))
VLLM_FACTS = SHARED.parent / "docs" / "reference" / "vllm-facts.md"

HEAD = """name: s
parameters:
  max_num_seqs:
    type: int
    low: 1
    high: 4
    flag: max-num-seqs
"""


# A budget that ends fast if nothing refuses the space.
QUICK = {
    "warm_start": 0,
    "confirm": 0,
    "load": {"max_requests": 2},
    "simulator": {"time_scale": 200},
}


def run(
    tmp_path: Path, space_text: str, *extra: str, settings: tuple[dict, ...] = ()
) -> tuple[int, str, Path]:
    """`autotune run` on a space file (a budget that ends fast if nothing refuses it)."""
    space = tmp_path / "space.yaml"
    space.write_text(space_text)
    args = ["run", "--workload", str(WORKLOAD), "--engine", "sim", "--hardware", "rtx4080s-32g",
            "--model", "qwen3.6-27b-awq", "--space", str(space),
            "--storage", f"sqlite:///{tmp_path / 'a.db'}", "--trials", "1", "--sampler", "random",
            *tuner_args(tmp_path / "settings", QUICK, *settings), *extra]  # fmt: skip
    with contextlib.chdir(tmp_path):  # the run's own files (studies/) would land here
        result = CliRunner().invoke(app, args)
    return result.exit_code, result.stderr, space


def files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def line_of(space: Path, needle: str) -> int:
    return next(n for n, line in enumerate(space.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("text", "field", "needle"),
    [
        (HEAD + f"fixed:\n  api_key: {SECRET}\n", "fixed.api_key", "api_key:"),
        (HEAD + f'fixed:\n  "api-key={SECRET}": true\n', "fixed.api-key=<redacted>", '"api-key='),
        (HEAD + f"fixed:\n  --api-key: {SECRET}\n", "fixed.--api-key", "--api-key:"),
        (
            HEAD + f"fixed:\n  served-model-name: 'qwen --api-key {SECRET}'\n",
            "fixed.served-model-name",
            "served-model-name:",
        ),
        (HEAD + f"fixed:\n  hf-token: hf_{'a' * 34}\n", "fixed.hf-token", "hf-token:"),
        (
            HEAD.replace("flag: max-num-seqs", "flag: api-key"),
            "parameters.max_num_seqs.flag",
            "flag: api-key",
        ),
        (
            HEAD + f"fixed:\n  kv-transfer-config:\n    extra:\n      token: Bearer {SECRET}\n",
            "fixed.kv-transfer-config.extra.token",
            "token:",
        ),
    ],
    ids=["api_key", "api-key=", "--api-key", "inside-a-value", "hf-token", "param-flag", "nested"],
)
def test_a_secret_in_any_spelling_is_refused_and_nothing_stored(
    tmp_path: Path, text: str, field: str, needle: str
) -> None:
    code, err, space = run(tmp_path, text)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{space}:{line_of(space, needle)}: {field}: " in err
    assert "environment" in err  # where the key belongs instead
    assert SECRET not in err
    assert not (tmp_path / "a.db").exists()
    assert files_holding(tmp_path, SECRET) in ([space], [])


@pytest.mark.parametrize("engine", ["sim", "vllm"])
def test_a_misspelled_flag_is_refused_before_the_first_trial(tmp_path: Path, engine: str) -> None:
    text = HEAD + "fixed:\n  language-model-only: true\n  kv-cache-dtpye: fp8\n"
    settings = ({"engine": {"vllm_executable": "/nonexistent/vllm"}},) if engine == "vllm" else ()
    code, err, space = run(tmp_path, text, "--engine", engine, settings=settings)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{space}:{line_of(space, 'kv-cache-dtpye')}: fixed.kv-cache-dtpye: " in err
    assert "did you mean kv-cache-dtype?" in err
    assert not (tmp_path / "a.db").exists()
    assert not (tmp_path / "studies").exists()  # no run log, no server log


@pytest.mark.parametrize(
    ("fixed", "expected"),
    [
        ("max_num_batched_tokens: 2048", "write it with dashes, max-num-batched-tokens"),
        ("kv-cache-memory: 8G", "write the whole name, kv-cache-memory-bytes"),
        ("port: 8000", "the engine gives each server a free port"),
        ("max-logprobs: 5", "vLLM has --max-logprobs but the simulator does not model it"),
    ],
)
def test_flag_names_autotune_would_misread_are_refused(
    tmp_path: Path, fixed: str, expected: str
) -> None:
    code, err, _ = run(tmp_path, HEAD + f"fixed:\n  {fixed}\n")
    assert code == 2, err
    assert expected in err, err


def test_a_newer_vllms_flag_passes_on_vllm_when_the_space_allows_it(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(HEAD + "fixed:\n  brand-new-flag: 3\n")
    with pytest.raises(SpaceError, match=r"space\.yaml:9: fixed\.brand-new-flag: .*allow_unknown"):
        check_flags(load_space(space), space, vllm_flags())
    space.write_text(HEAD + "fixed:\n  brand-new-flag: 3\nallow_unknown_flags: [brand-new-flag]\n")
    check_flags(load_space(space), space, vllm_flags())  # passes on real vLLM
    with pytest.raises(SpaceError, match="takes only the flags it models, not --brand-new-flag"):
        check_flags(load_space(space), space, sim_flags())


def test_a_gated_flag_passes_on_vllm_and_where_the_gate_drops_it_on_the_simulator(
    tmp_path: Path,
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(HEAD + "fixed:\n  brand-new-flag: 3\ngates:\n"
                     "  - flag: brand-new-flag\n    versions: '>=0.34'\n")  # fmt: skip
    check_flags(load_space(space), space, vllm_flags())  # the gate vouches for it
    check_flags(load_space(space), space, sim_flags())  # dropped at the simulator's 0.33.0
    space.write_text(space.read_text().replace(">=0.34", ">=0.30"))
    with pytest.raises(SpaceError, match="the simulator has no flag --brand-new-flag"):
        check_flags(load_space(space), space, sim_flags())


def test_allow_unknown_flags_leaves_the_digest_of_older_spaces_alone(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(HEAD)
    before = load_space(space).digest()
    space.write_text(HEAD + "allow_unknown_flags: []\n")
    assert load_space(space).digest() == before
    space.write_text(HEAD + "allow_unknown_flags: [x-flag]\n")
    assert load_space(space).digest() != before


@pytest.mark.skipif(not VLLM_FACTS.exists(), reason=f"{VLLM_FACTS} absent (shared docs)")
def test_every_serve_flag_the_vllm_facts_name_is_known() -> None:
    """Section 1 of the reference (vLLM 0.33's CLI, read from its source) against the list."""
    text = VLLM_FACTS.read_text()
    cli = text[text.index("## 1. CLI flags") : text.index("## 2. Startup log lines")]
    named = set(re.findall(r"`--([a-z][a-z0-9-]*[a-z0-9])[` =]", cli))
    named -= {"flag", "no-flag", "key", "no-key"}  # the prose's placeholders (--flag/--no-flag)
    missing = sorted(name for name in named if not vllm_flags().takes(name))
    assert len(named) > 40
    assert missing == ["kv-cache-memory"]  # the docs' own note: only a prefix of -bytes
