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
