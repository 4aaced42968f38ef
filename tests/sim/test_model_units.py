"""vLLM's human-readable integers and the prompt template."""

from __future__ import annotations

import pytest

from autotune.errors import InputError
from autotune.replay.payloads import render_prompt
from autotune.sim.model.prompt import TOKENS_PER_MESSAGE, PromptRenderer, render_prompt_token_ids
from autotune.sim.model.units import parse_human_int
from autotune.workload.plan import Message
from autotune.workload.tokenizer import WordTokenizer


@pytest.mark.parametrize(
    ("text", "value"),
    [("9G", 9 * 2**30), ("9g", 9 * 10**9), ("25.6k", 25_600), ("2048", 2048), ("1K", 1024)],
)
def test_parse_human_int(text: str, value: int) -> None:
    assert parse_human_int(text) == value


@pytest.mark.parametrize("text", ["1.5G", "nine", "3.5", "9X"])
def test_parse_human_int_rejects(text: str) -> None:
    with pytest.raises(InputError, match="--kv-cache-memory-bytes"):
        parse_human_int(text, field="--kv-cache-memory-bytes")


def test_chat_prompt_template_costs_fixed_tokens_per_message() -> None:
    messages = (Message("user", "one two three"), Message("assistant", "four five"))
    ids = render_prompt_token_ids("sys tem", messages, "openai.chat")
    assert len(ids) == 2 + 3 + 2 + 3 * TOKENS_PER_MESSAGE + 2  # words, templates, generation


def test_completions_prompt_is_the_rendered_text() -> None:
    messages = (Message("user", "one two three"),)
    ids = render_prompt_token_ids("sys", messages, "openai.completions")
    # "sys", "\n\n", "user", ":", " one", " two", " three"
    assert ids == WordTokenizer().encode(render_prompt("sys", messages))
    assert len(ids) == 7


def test_shared_history_gives_shared_prefix_ids() -> None:
    renderer = PromptRenderer()
    first = (Message("user", "alpha beta"),)
    second = (*first, Message("assistant", "gamma"), Message("user", "delta"))
    turn1 = renderer.render("system words", first, "anthropic.messages")
    turn2 = renderer.render("system words", second, "anthropic.messages")
    assert turn2[: len(turn1) - 2] == turn1[:-2]  # all but the generation prompt
