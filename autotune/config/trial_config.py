"""TrialConfig: the full, validated set of engine flags one trial launches with."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FlagValue = str | int | float | bool | dict[str, Any] | list[Any] | None


class TrialConfig(BaseModel):
    """The launch configuration of one trial.

    ``flags`` maps vLLM flag names *without* the leading dashes and with dashes
    (``"kv-cache-memory-bytes"``) to values, in the order they are passed:

    - ``True``  -> ``--flag``;  ``False`` -> ``--no-flag``;  ``None`` -> omitted
    - ``dict`` / ``list`` -> the JSON text (``--speculative-config '{"method": ...}'``)
    - anything else -> ``str(value)``

    Host, port and the executable are the engine's business, not the config's.
    """

    model_config = ConfigDict(frozen=True)

    model: str
    flags: dict[str, FlagValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)

    def vllm_args(self) -> list[str]:
        """The argv tail after ``vllm serve``: model first, then the flags."""
        argv = [self.model]
        for name, value in self.flags.items():
            if value is None:
                continue
            if value is True:
                argv.append(f"--{name}")
            elif value is False:
                argv.append(f"--no-{name}")
            elif isinstance(value, dict | list):
                argv += [f"--{name}", json.dumps(value, separators=(",", ":"))]
            else:
                argv += [f"--{name}", str(value)]
        return argv

    def flag(self, name: str, default: FlagValue = None) -> FlagValue:
        """The value of one flag, or ``default`` when it is not set."""
        value = self.flags.get(name)
        return default if value is None else value


def launched_value(name: str, searched: Any, flags: dict[str, Any]) -> tuple[Any, bool]:
    """A parameter's value as the trial launched it, and whether a derived rule replaced
    the searched one (2N-1 batched tokens with MTP and LMCache on)."""
    launched = flags.get(name.replace("_", "-"), searched)
    if launched != searched and not isinstance(launched, bool | dict | list):
        return launched, True
    return searched, False


def params_text(params: dict[str, Any], flags: dict[str, Any] | None = None) -> str:
    """``name=value`` pairs, floats short; with ``flags``, launched values marked ``*``."""
    parts = []
    for name, searched in params.items():
        value, replaced = launched_value(name, searched, flags or {})
        text = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{name}={text}{'*' if replaced else ''}")
    return " ".join(parts)
