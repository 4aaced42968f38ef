"""The workload file format ("autotune-workload", version 1): pydantic records, one per JSONL line.

A file is a header line, then prefix and request lines in dependency order
(a request names only prefixes and requests defined above it). See
docs/workload-format.md for the full description; in short:

- ``header``: format, version, token space, hash block size and scope, the
  default endpoint.
- ``prefix``: a shared system prompt (system text + tool definitions), literal
  or synthetic, referenced by id from requests.
- ``request``: one LLM call. ``input`` is ``delta`` (the parent's prompt, its
  response, then ``append``), ``full`` (explicit system + messages) or
  ``blocks`` (Mooncake-style hash ids of fixed-size token blocks).

Content is a list of parts, each either literal (``{"text": ...}``) or
synthetic (``{"tokens": N, "hash_ids": [...]}``): synthetic text is
deterministic, so identical hash ids give identical text on every replay.

Every count is bounded when a line is read (``TokenCount``, ``Seconds``): a count
past the bound is a typo or a corrupt file, and building its text would need
terabytes (a 1e12-token output was a MemoryError deep in the expansion).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from autotune.workload.plan import Endpoint

FORMAT_NAME = "autotune-workload"
FORMAT_VERSION = 1
DEFAULT_BLOCK_SIZE = 64
DEFAULT_ENDPOINT: Endpoint = "openai.chat"

Role = Literal["system", "user", "assistant"]
HashScope = Literal["global", "session"]

# The longest context any served model takes is 10M tokens (Llama 4 Scout), 50x Claude
# Code's 200k: no real prompt, output or block is longer, and no request's context
# (prompt + output, checked when the file is expanded).
MAX_TOKENS = 10_000_000
# Recorded offsets and gaps: traces span hours or days; a year is no recording.
MAX_SECONDS = 366 * 86_400


def _at_most_max_tokens(count: int) -> int:
    if count > MAX_TOKENS:
        raise ValueError(
            f"{count:,} is past the bound of {MAX_TOKENS:,} (the longest context any model "
            "takes, in tokens): a typo or a corrupt file?"
        )
    return count


def _at_most_max_seconds(seconds: float) -> float:
    if seconds > MAX_SECONDS:
        raise ValueError(f"{seconds:g} s is longer than any recording (at most {MAX_SECONDS:,} s)")
    return seconds


TokenCount = Annotated[int, AfterValidator(_at_most_max_tokens)]  # counts, token or block
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False), AfterValidator(_at_most_max_seconds)]
HashIds = Annotated[list[int], Field(max_length=MAX_TOKENS)]  # a block holds a token or more


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextPart(_Record):
    """Literal text."""

    text: str


class SynthPart(_Record):
    """Synthetic text of exactly ``tokens`` tokens.

    With ``hash_ids``, block i is the deterministic text of hash id i
    (``block_size`` tokens, the last one possibly shorter); tokens beyond the
    hashed blocks are unique to this part. ``scope`` overrides the header's
    hash scope (``global``: ids are comparable across sessions).
    """

    tokens: TokenCount = Field(ge=1)
    hash_ids: HashIds | None = None
    scope: HashScope | None = None


Part = TextPart | SynthPart


class WireMessage(_Record):
    """A chat message; ``content`` is a string or a list of parts."""

    role: Role
    content: str | list[Part]

    def parts(self) -> list[Part]:
        if isinstance(self.content, str):
            return [TextPart(text=self.content)]
        return list(self.content)


class Header(_Record):
    type: Literal["header"] = "header"
    format: Literal["autotune-workload"] = FORMAT_NAME
    version: int
    name: str | None = None
    token_space: str = "words"  # the tokenizer the recorded counts are in
    block_size: TokenCount = Field(default=DEFAULT_BLOCK_SIZE, ge=1)  # tokens per hash id
    hash_scope: HashScope = "session"
    endpoint: Endpoint = DEFAULT_ENDPOINT
    seed: int = 0  # mixed into every synthetic block
    source: dict[str, object] = Field(default_factory=dict)  # provenance, free-form


class PrefixRecord(_Record):
    """A shared system prompt (system text and rendered tool definitions)."""

    type: Literal["prefix"] = "prefix"
    id: str
    system: list[Part] = Field(min_length=1)


class DeltaInput(_Record):
    """Prompt = parent's messages and the parent's response (as an assistant
    message), cut to the first ``keep_messages`` of them when given (a rewind
    or a compaction), then ``append``."""

    mode: Literal["delta"] = "delta"
    append: list[WireMessage] = Field(min_length=1)
    keep_messages: TokenCount | None = Field(default=None, ge=0)


class FullInput(_Record):
    """An explicit prompt: optional extra system parts (after the prefix), then messages."""

    mode: Literal["full"] = "full"
    system: list[Part] | None = None
    messages: list[WireMessage] = Field(min_length=1)


class BlocksInput(_Record):
    """A prompt of ``tokens`` tokens from hashed blocks (``block_size`` tokens each).

    The first ``system_blocks`` blocks form the system prompt; the rest is
    user content. Tokens past the hashed blocks are unique to this request.
    """

    mode: Literal["blocks"] = "blocks"
    hash_ids: HashIds = Field(min_length=1)
    tokens: TokenCount = Field(ge=1)
    system_blocks: TokenCount = Field(default=0, ge=0)


class Output(_Record):
    """The response: ``tokens`` is the exact target length (``exact``: force it).

    ``text`` is the recorded response; without it the next turn's history
    holds deterministic synthetic text of exactly ``tokens`` tokens.
    """

    tokens: TokenCount = Field(ge=1)
    exact: bool = True
    text: str | None = None


Input = Annotated[DeltaInput | FullInput | BlocksInput, Field(discriminator="mode")]


class RequestRecord(_Record):
    """One LLM call.

    ``after`` defaults to ``[parent]``; ``gap_s`` is the think / tool time
    after the last of them; ``t_s`` the recorded arrival offset (when absent:
    the latest ``after`` arrival plus ``gap_s``).
    """

    type: Literal["request"] = "request"
    id: str
    session: str | None = None
    thread: str = "main"
    parent: str | None = None
    after: list[str] | None = None
    gap_s: Seconds = 0.0
    t_s: Seconds | None = None
    endpoint: Endpoint | None = None
    prefix: str | None = None
    input: Input
    output: Output
    input_tokens: TokenCount | None = Field(default=None, ge=0)  # recorded, informational
    expect: dict[str, object] | None = None  # recorded measurements, never drive replay

    @model_validator(mode="after")
    def _delta_needs_parent(self) -> RequestRecord:
        if isinstance(self.input, DeltaInput) and self.parent is None:
            raise ValueError("input.mode 'delta' needs a parent")
        if isinstance(self.input, DeltaInput) and self.prefix is not None:
            raise ValueError("a delta request inherits its parent's prefix; drop 'prefix'")
        return self

    def dependencies(self) -> list[str]:
        if self.after is not None:
            return list(self.after)
        return [self.parent] if self.parent is not None else []


Record = Annotated[Header | PrefixRecord | RequestRecord, Field(discriminator="type")]
