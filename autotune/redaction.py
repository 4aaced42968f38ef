"""Secrets: which flags carry one, what looks like one, and its removal from what we write.

A key must never reach a study, a log or the screen. The space file refuses a
secret-bearing flag outright (``space.py``); whatever reaches text some other
way (a server that echoes its environment, an error quoting a header) is
replaced by ``REDACTED`` by ``redact``, which every writer applies: the trial
attrs (``trial_record.py``), the server log (``engines/process.py``), the
failure a log yields (``engines/vllm_log.py``), run.log and the screen
(``cli/_run_output.py``, ``cli/_common.py``) and the request records artifact.

What counts as a secret:

- the value of a flag or key whose name says so (``--api-key X``, ``api_key: X``,
  ``x-api-key: X``, ``VLLM_API_KEY=X``, ``hf_token``, ``...secret...``, ``password``),
  eight characters or more (shorter words are prose: "api-key: keys are ...");
- the shapes keys have whatever their context: ``sk-...`` (OpenAI, Anthropic),
  ``hf_...`` (Hugging Face), ``Bearer ...``;
- the value of any environment variable of this process whose name says so
  (``VLLM_API_KEY``, ``HF_TOKEN``, ``ANTHROPIC_API_KEY``...), wherever it appears.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path
from typing import Any

REDACTED = "<redacted>"
# vLLM 0.33's serve flags that carry a secret (vllm/entrypoints/common/startup.py redacts
# the same fields from its own "non-default args" line), and where each belongs instead.
SECRET_FLAGS: dict[str, str] = {
    "api-key": "set VLLM_API_KEY in the environment instead",
    "hf-token": "set HF_TOKEN in the environment instead",
}
MIN_SECRET_CHARS = 8  # a shorter value after "api-key:" is a word, not a key
MIN_ENV_SECRET_CHARS = 8  # ANTHROPIC_API_KEY=dummy (a placeholder) is left alone

_NAME = (
    r"(?:api[-_]?key|hf[-_]?token|auth[-_]?token|access[-_]?token|bearer[-_]?token"
    r"|secret|password|passwd|credentials?)"
)
SECRET_NAME = re.compile(_NAME, re.IGNORECASE)
# A value: up to a space, quote, comma, bracket or colon (the "field: message" after it);
# one already redacted is left as it is.
_VALUE = rf"(?!{REDACTED})[^\s'\",\]}}:]{{{MIN_SECRET_CHARS},}}"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # --api-key VALUE, --api_key=VALUE (argv, argparse echoes)
    (
        re.compile(rf"(--[\w-]*{_NAME}[\w-]*(?:=|\s+)['\"]?)(?!-){_VALUE}", re.IGNORECASE),
        rf"\1{REDACTED}",
    ),
    # api_key: VALUE, "x-api-key": "VALUE", 'api_key': ['VALUE'], VLLM_API_KEY=VALUE (from
    # the name on: a leading [\w-]* would be tried at every character of a long log)
    (
        re.compile(rf"({_NAME}[\w-]*['\"]?\s*[:=]\s*\[?\s*['\"]?){_VALUE}", re.IGNORECASE),
        rf"\1{REDACTED}",
    ),
    (re.compile(r"(\bBearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE), rf"\1{REDACTED}"),
    (re.compile(r"(?<![\w-])sk-[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"(?<![\w-])hf_[A-Za-z0-9]{20,}"), REDACTED),
)
# Text no pattern can match without: only the lines holding one are searched (a server log
# is megabytes of lines with none).
_TRIGGERS = (
    *(f"{a}{sep}{b}" for a, b in (("api", "key"), ("hf", "token"), ("auth", "token"),
                                  ("access", "token"), ("bearer", "token")) for sep in "-_"),
    "apikey", "hftoken", "authtoken", "accesstoken", "bearertoken",
    "secret", "password", "passwd", "credential", "bearer", "sk-", "hf_",
)  # fmt: skip
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)  # keeps length


# GOOGLE_APPLICATION_CREDENTIALS_FILE, PASSWORD_STORE_DIR: where a secret is, not one.
_PLACE_NAME = re.compile(r"_(?:PATH|FILE|DIR|HOME|URL|SOCK)$", re.IGNORECASE)


def _environment_secrets() -> list[str]:
    """Values of this process's environment variables whose names say they are secret."""
    found = {
        value
        for name, value in os.environ.items()
        if SECRET_NAME.search(name)
        and not _PLACE_NAME.search(name)
        and len(value) >= MIN_ENV_SECRET_CHARS
    }
    return sorted(found, key=len, reverse=True)  # a key containing another goes first


def redact(text: str) -> str:
    """``text`` with every secret-looking value replaced by ``REDACTED``."""
    for secret in _environment_secrets():
        text = text.replace(secret, REDACTED)
    spans = _lines_with_triggers(text)
    if not spans:
        return text
    pieces, done = [], 0
    for start, end in spans:
        line = text[start:end]
        for pattern, replacement in _PATTERNS:
            line = pattern.sub(replacement, line)
        pieces += [text[done:start], line]
        done = end
    pieces.append(text[done:])
    return "".join(pieces)


def _lines_with_triggers(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line of ``text`` holding a trigger, in order."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a character that lowers to two (İ): offsets would drift
        lowered = text.translate(_ASCII_LOWER)
    starts: dict[int, int] = {}
    for trigger in _TRIGGERS:
        found = lowered.find(trigger)
        while found != -1:
            start = lowered.rfind("\n", 0, found) + 1
            end = lowered.find("\n", found)
            end = len(lowered) if end == -1 else end
            starts[start] = end
            found = lowered.find(trigger, end)
    return sorted(starts.items())


def redact_json(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings) with ``redact`` applied to every string,
    dict keys included."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_json(key): redact_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(item) for item in value]
    return value


def redact_file(path: Path) -> None:
    """Rewrite a text file with its secrets redacted (unchanged files are not rewritten)."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return
    cleaned = redact(text)
    if cleaned != text:
        path.write_text(cleaned, encoding="utf-8")


def secret_flag(name: str) -> str | None:
    """Where a secret-bearing flag's value belongs instead, when ``name`` is one in any
    spelling (``api_key``, ``--api-key``, ``api-key=sk-...``, an argparse prefix such as
    ``api-ke``), else None."""
    spelled = name.strip().lstrip("-").lower().replace("_", "-")
    canonical = re.split(r"[=\s.]", spelled, maxsplit=1)[0]
    for flag, instead in SECRET_FLAGS.items():
        if canonical == flag or (len(canonical) >= 5 and flag.startswith(canonical)):
            return instead
    if SECRET_NAME.search(canonical):
        return "pass secrets through the environment instead"
    return None


def looks_secret(text: str) -> bool:
    """Whether ``text`` holds something ``redact`` would remove, or a secret flag."""
    return redact(text) != text or re.search(rf"--[\w-]*{_NAME}", text, re.IGNORECASE) is not None
