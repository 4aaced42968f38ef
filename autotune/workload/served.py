"""A workload expanded for the model a server will serve: token-exact when its tokenizer is here.

``plan_for_model`` expands a workload file in the served model's own tokenizer
(a model directory, a ``tokenizer.json`` or the local Hugging Face cache), so a
real engine receives the request sizes, shared prefixes and output lengths the
file describes, to the token. Without one it falls back to the word
approximation and returns a note saying so, with the error to expect.
``requests_over`` is the pre-flight's view: which requests will not fit a
context after tokenisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.workload.expand import load_plan
from autotune.workload.hf_tokenizer import HfTokenizer, load_tokenizer
from autotune.workload.plan import PlannedRequest, WorkloadPlan

# Real tokens per pseudo-word of the word approximation: 1.99 measured on Mistral's Tekken
# (scripts/measure_token_counts.py, docs/replay.md); the range allows for other vocabularies.
WORD_APPROXIMATION_TOKENS = (1.6, 2.6)
# ChatML, as Qwen and most served chat models use it: "<|im_start|>role\n ... <|im_end|>\n"
# per message and "<|im_start|>assistant\n" to generate; the pre-flight's estimate of the
# template before a server can be asked (the replay measures the real one).
TEMPLATE_TOKENS_PER_MESSAGE = 5
TEMPLATE_TOKENS_FIXED = 3


@dataclass(frozen=True)
class ServedPlan:
    """A plan for one served model, the tokenizer it is exact in, and what to tell the user."""

    plan: WorkloadPlan
    tokenizer: HfTokenizer | None
    note: str | None  # set when the plan is not token-exact for this model


def find_tokenizer(model: str, tokenizer: str | None = None) -> HfTokenizer | None:
    """The served model's tokenizer: ``tokenizer`` if given, else the model's own, offline."""
    return load_tokenizer(tokenizer or model)


def word_approximation_note(model: str) -> str:
    low, high = WORD_APPROXIMATION_TOKENS
    return (
        f"no tokenizer for {model!r} found offline (model directory, tokenizer.json or the "
        "Hugging Face cache; name one with the engine.tokenizer setting, docs/tuner.md): "
        "prompts are sent in the word "
        f"approximation, whose words real tokenizers count as {low:g}-{high:g} tokens each "
        "(Mistral's Tekken: 1.99), so expect served prompts about that many times the "
        "workload's token counts; each trial's first requests are checked against the "
        "server's own counts"
    )


def plan_for_model(path: Path, *, model: str, tokenizer: str | None = None) -> ServedPlan:
    """Expand ``path`` in the tokenizer of ``model`` (or ``tokenizer``) when one is here."""
    found = find_tokenizer(model, tokenizer)
    if found is None:
        return ServedPlan(load_plan(path), None, word_approximation_note(model))
    return ServedPlan(load_plan(path, tokenizer=found), found, None)


def served_prompt_tokens(request: PlannedRequest) -> int:
    """The prompt a server will count: the plan's text and an estimate of the chat template."""
    if request.endpoint == "openai.completions":
        return request.prompt_tokens
    messages = len(request.messages) + (1 if request.system else 0)
    return request.prompt_tokens + TEMPLATE_TOKENS_FIXED + TEMPLATE_TOKENS_PER_MESSAGE * messages


def requests_over(plan: WorkloadPlan, max_tokens: int) -> list[tuple[PlannedRequest, int]]:
    """Requests whose prompt after tokenisation plus output exceeds ``max_tokens``
    (the context, e.g. --max-model-len), each with that total."""
    over = []
    for request in plan.requests:
        total = served_prompt_tokens(request) + request.output_tokens
        if total > max_tokens:
            over.append((request, total))
    return over
