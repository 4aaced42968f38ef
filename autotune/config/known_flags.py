"""The flag names each engine takes, so a space's flags are checked before the first trial.

A misspelled flag (``kv-cache-dtpye``) makes every launch exit 2: a night of
``invalid-args`` trials. ``KnownFlags.problem`` says what is wrong with a name
in one sentence, with the closest known flag when there is one.

- vLLM: ``data/vllm-0.33.0-flags.txt``, the `vllm serve` parser of the 0.33.0
  wheel (written by scripts/extract_vllm_flags.py; docs/reference: vllm-facts.md
  section 1). A flag of a newer vLLM is allowed by the space's ``allow_unknown_flags``
  or by a ``gates:`` entry naming it (the gate says which versions have it).
- the simulator: its own parser (``sim/server/flags.py``), which takes the vLLM flags it
  models and answers any other as vLLM answers an unknown flag.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from pathlib import Path

from autotune.sim.server.flags import EMULATED_VLLM_VERSION, build_parser

VLLM_FLAGS_VERSION = "0.33.0"
VLLM_FLAGS_FILE = Path(__file__).with_name("data") / f"vllm-{VLLM_FLAGS_VERSION}-flags.txt"
# The engine sets these itself on every launch (a free port, 127.0.0.1).
ENGINE_OWNED = {
    "host": "the engine binds each server to 127.0.0.1",
    "port": "the engine gives each server a free port",
}
_SIM_OWNED = frozenset({"help", "hardware", "time-scale"})  # SimEngine's own options


@dataclass(frozen=True)
class KnownFlags:
    """The flags one engine accepts (names without dashes, as a space writes them)."""

    engine: str  # for messages: "vLLM 0.33.0", "the simulator"
    version: str  # the vLLM version these are the flags of (the simulator: the one it speaks)
    names: frozenset[str]
    # Real vLLM: a newer version than the list's may take more (allow_unknown_flags, gates).
    accepts_newer: bool = False
    modelled_elsewhere: frozenset[str] = frozenset()  # vLLM flags the simulator lacks
    takes_dotted: bool = False  # --json-flag.key value (vLLM's FlexibleArgumentParser)

    def problem(self, name: str) -> str | None:
        """What is wrong with flag ``name`` for this engine, or None when it takes it."""
        if name in ENGINE_OWNED:
            return f"--{name} is not the space's to set: {ENGINE_OWNED[name]}"
        if name.startswith("-"):
            return f"write the flag without dashes: {name.lstrip('-')}"
        if "=" in name or " " in name:
            return f"{name.split('=')[0].strip()!r} is a flag name; its value goes after the colon"
        base = name.split(".", 1)[0] if self.takes_dotted else name
        if self.takes(base):
            return None
        dashed = name.replace("_", "-")
        if dashed != name and self.takes(dashed.split(".", 1)[0]):
            return f"write it with dashes, {dashed}: autotune reads flags by that name"
        completions = sorted(flag for flag in self.names if flag.startswith(dashed))
        if len(completions) == 1 and dashed:
            return (
                f"write the whole name, {completions[0]}: vLLM takes a unique prefix, but "
                "autotune reads flags by their full name"
            )
        if dashed in self.modelled_elsewhere:
            return (
                f"vLLM has --{dashed} but {self.engine} does not model it; tune it on "
                "--engine vllm, or leave it out"
            )
        close = difflib.get_close_matches(dashed, self.names, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        newer = (
            " (a flag of a newer vLLM: list it under allow_unknown_flags)"
            if self.accepts_newer
            else ""
        )
        return f"{self.engine} has no flag --{dashed}{hint}{newer}"

    def takes(self, name: str) -> bool:
        """Whether ``name`` is one of the flags (``no-X`` of a flag X too)."""
        if name in self.names:
            return True
        # --no-X of a boolean flag (TrialConfig writes False so); vLLM's EnableDisableAction
        # also pairs --enable-X with --disable-X.
        for prefix, inverse in (("no-", ""), ("disable-", "enable-"), ("enable-", "disable-")):
            if name.startswith(prefix) and inverse + name.removeprefix(prefix) in self.names:
                return True
        return False


@functools.cache
def vllm_flags() -> KnownFlags:
    """`vllm serve`'s flags (vLLM 0.33.0)."""
    lines = VLLM_FLAGS_FILE.read_text().splitlines()
    names = frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))
    return KnownFlags(
        engine=f"vLLM {VLLM_FLAGS_VERSION}",
        version=VLLM_FLAGS_VERSION,
        names=names,
        accepts_newer=True,
        takes_dotted=True,
    )


@functools.cache
def sim_flags() -> KnownFlags:
    """The simulator's flags: the vLLM flags it models, and its fault options."""
    options = {  # argparse lists its options only in this attribute
        option[2:]
        for action in build_parser()._actions
        for option in action.option_strings
        if option.startswith("--")
    }
    names = frozenset(options - _SIM_OWNED - set(ENGINE_OWNED))
    return KnownFlags(
        engine="the simulator",
        version=EMULATED_VLLM_VERSION,
        names=names,
        modelled_elsewhere=vllm_flags().names - names,
    )


def known_flags(engine: str) -> KnownFlags:
    """The flags of engine ``engine`` ("sim" or "vllm")."""
    return sim_flags() if engine == "sim" else vllm_flags()
