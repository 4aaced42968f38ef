"""How the simulated server turns a request's messages into prompt token ids.

A ChatML-like template over a text tokenizer (``WordTokenizer``, which counts
text like a BPE tokenizer, or the served model's own ``HfTokenizer``): every
message costs ``<|im_start|>``, its role, its tokens and ``<|im_end|>``, and a
chat prompt ends with ``<|im_start|> assistant`` (the generation prompt). A
completions prompt is the text as sent, tokenized as a whole. The server and
the in-process predictor both call these functions, so both see the same
tokens and the same prefix-cache hits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from autotune.replay.payloads import render_prompt
from autotune.sim.model.prefix_cache import block_hashes
from autotune.workload.plan import Endpoint, Message, PlannedRequest
from autotune.workload.tokenizer import Tokenizer, WordTokenizer

# Reserved ids above any text token id (WordTokenizer ids are < 2**31).
IM_START_ID = (1 << 31) + 1
IM_END_ID = (1 << 31) + 2
_ROLE_IDS = {"system": (1 << 31) + 10, "user": (1 << 31) + 11, "assistant": (1 << 31) + 12}
_OTHER_ROLE_ID = (1 << 31) + 19
TOKENS_PER_MESSAGE = 3  # <|im_start|> role ... <|im_end|>
GENERATION_PROMPT = (IM_START_ID, _ROLE_IDS["assistant"])


class PromptRenderer:
    """Renders prompts to token ids, remembering each message's ids.

    A plan's turns share Message objects with earlier turns, so caching per
    message makes a long session cost its new words only.
    """

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self._tokenizer = tokenizer or WordTokenizer()
        self._message_ids: dict[tuple[str, str], np.ndarray] = {}
        # A planned request's prompt and prefix hashes, by the request itself (its content).
        self._planned_ids: dict[PlannedRequest, np.ndarray] = {}
        self._planned_hashes: dict[tuple[PlannedRequest, int, str | None], list[int]] = {}

    def text_ids(self, text: str) -> list[int]:
        """Token ids of plain text (a completions prompt)."""
        return self.text_array(text).tolist()

    def text_array(self, text: str) -> np.ndarray:
        """``text_ids`` as an int64 array."""
        return np.asarray(self._tokenizer.encode(text), dtype=np.int64)

    def message_ids(self, role: str, text: str) -> np.ndarray:
        """The ids one chat message contributes, template tokens included."""
        key = (role, text)
        ids = self._message_ids.get(key)
        if ids is None:
            head = np.array([IM_START_ID, _ROLE_IDS.get(role, _OTHER_ROLE_ID)], dtype=np.int64)
            tail = np.array([IM_END_ID], dtype=np.int64)
            ids = np.concatenate([head, self.text_array(text), tail])
            self._message_ids[key] = ids
        return ids

    def chat_ids(self, system: str | None, messages: Iterable[tuple[str, str]]) -> np.ndarray:
        """Ids of a chat prompt: system (if any), each (role, text), generation prompt."""
        parts = [self.message_ids("system", system)] if system else []
        parts += [self.message_ids(role, text) for role, text in messages]
        parts.append(np.array(GENERATION_PROMPT, dtype=np.int64))
        return np.concatenate(parts)

    def render_array(
        self, system: str | None, messages: Sequence[Message], endpoint: Endpoint
    ) -> np.ndarray:
        """Prompt ids of a planned request, exactly as the simulated server computes them."""
        if endpoint == "openai.completions":
            return self.text_array(render_prompt(system, tuple(messages)))
        if endpoint == "anthropic.messages":
            # The Anthropic face folds system turns into the system text.
            parts = [system] if system else []
            parts += [m.text for m in messages if m.role == "system"]
            turns = [(m.role, m.text) for m in messages if m.role != "system"]
            return self.chat_ids("\n\n".join(parts) or None, turns)
        return self.chat_ids(system, ((m.role, m.text) for m in messages))

    def planned_array(self, request: PlannedRequest) -> np.ndarray:
        """``render_array`` of a planned request, kept: the replays of one plan (the
        predictor's, thousands of configs) render each request once. Read-only."""
        ids = self._planned_ids.get(request)
        if ids is None:
            ids = self.render_array(request.system, request.messages, request.endpoint)
            ids.flags.writeable = False
            self._planned_ids[request] = ids
        return ids

    def planned_hashes(
        self, request: PlannedRequest, unit_tokens: int, salt: str | None
    ) -> list[int]:
        """``block_hashes`` of ``planned_array(request)``, kept likewise. Read-only."""
        key = (request, unit_tokens, salt)
        hashes = self._planned_hashes.get(key)
        if hashes is None:
            hashes = block_hashes(self.planned_array(request), unit_tokens, salt=salt)
            self._planned_hashes[key] = hashes
        return hashes

    def render(
        self, system: str | None, messages: Sequence[Message], endpoint: Endpoint
    ) -> list[int]:
        """``render_array`` as a list of ints."""
        return self.render_array(system, messages, endpoint).tolist()


def render_prompt_token_ids(
    system: str | None, messages: Sequence[Message], endpoint: Endpoint
) -> list[int]:
    """Prompt token ids for one request (a fresh renderer; see PromptRenderer to reuse)."""
    return PromptRenderer().render(system, messages, endpoint)
