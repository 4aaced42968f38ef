"""Planned vs served prompt tokens: did the server get the prompts the plan describes?

The plan counts the text of each prompt in its token space; the server adds its
chat template. ``measure_template_overhead`` asks the server's ``/tokenize``
(vLLM and the simulator both have it) how many tokens the template adds, once
per model and endpoint: a chat of ``n`` one-token messages costs
``fixed + per_message * n`` tokens beyond its text. ``check_prompt_tokens``
then compares the first requests of a replay with the server's own
``usage.prompt_tokens`` and says, in plain words, when they disagree.
"""

from __future__ import annotations

import json
import statistics

import httpx
from pydantic import BaseModel, ConfigDict

from autotune.replay.payloads import render_prompt
from autotune.replay.records import RequestRecord, TokenCheck
from autotune.workload.plan import Endpoint, Message, PlannedRequest, WorkloadPlan

CHECKED_REQUESTS = 8  # the first completed requests of a replay that are checked
TOLERANCE = 0.01  # a request's served count may differ from the plan by this fraction ...
TOLERANCE_TOKENS = 2  # ... or by this many tokens, whichever is larger
_PROBE = "hello"  # message text of the template probes (its own count is measured too)


class TemplateOverhead(BaseModel):
    """Tokens the server's template adds to a prompt of ``n`` messages (system included)."""

    model_config = ConfigDict(frozen=True)

    fixed: int
    per_message: int

    def tokens(self, messages: int) -> int:
        return self.fixed + self.per_message * messages


_overheads: dict[tuple[str, Endpoint], TemplateOverhead] = {}  # once per model


async def _count(
    client: httpx.AsyncClient, body: dict[str, object], headers: dict[str, str]
) -> int:
    response = await client.post("/tokenize", content=json.dumps(body), headers=headers)
    response.raise_for_status()
    return int(response.json()["count"])


def _probe_body(messages: int, endpoint: Endpoint, model_name: str) -> dict[str, object]:
    """``messages`` probe messages (a system one first when 2) as /tokenize takes them."""
    system = _PROBE if messages > 1 else None
    if endpoint == "openai.completions":
        prompt = render_prompt(system, (Message("user", _PROBE),))
        return {"model": model_name, "prompt": prompt}
    chat = [{"role": "system", "content": _PROBE}] if system else []
    chat.append({"role": "user", "content": _PROBE})
    return {"model": model_name, "messages": chat}  # vLLM's Anthropic face uses the same template


async def measure_template_overhead(
    client: httpx.AsyncClient, *, model_name: str, endpoint: Endpoint, api_key: str | None
) -> TemplateOverhead | None:
    """The template's tokens for this model and endpoint (cached); None without /tokenize."""
    key = (model_name, endpoint)
    if key in _overheads:
        return _overheads[key]
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    try:
        probe = await _count(
            client, {"model": model_name, "prompt": _PROBE, "add_special_tokens": False}, headers
        )
        one, two = [
            await _count(client, _probe_body(n, endpoint, model_name), headers) - probe * n
            for n in (1, 2)
        ]
        overhead = TemplateOverhead(fixed=2 * one - two, per_message=two - one)
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None  # no /tokenize here: the replay goes on unchecked
    _overheads[key] = overhead
    return overhead


async def measure_plan_overheads(
    client: httpx.AsyncClient, plan: WorkloadPlan, *, model_name: str, api_key: str | None
) -> dict[Endpoint, TemplateOverhead]:
    """The template overhead of each endpoint the plan's first requests use."""
    endpoints = {request.endpoint for request in plan.requests[: CHECKED_REQUESTS * 4]}
    overheads: dict[Endpoint, TemplateOverhead] = {}
    for endpoint in sorted(endpoints):
        overhead = await measure_template_overhead(
            client, model_name=model_name, endpoint=endpoint, api_key=api_key
        )
        if overhead is not None:
            overheads[endpoint] = overhead
    return overheads


def _messages(request: PlannedRequest) -> int:
    return len(request.messages) + (1 if request.system else 0)


def _allowed(planned: int) -> float:
    return max(TOLERANCE * planned, TOLERANCE_TOKENS)


def check_prompt_tokens(
    plan: WorkloadPlan,
    records: list[RequestRecord],
    overheads: dict[Endpoint, TemplateOverhead],
    *,
    first: int = CHECKED_REQUESTS,
) -> TokenCheck | None:
    """Planned vs served for the first ``first`` completed requests sent as planned
    (None when none was, or the template of their endpoint is unknown)."""
    planned_by_id = {request.id: request for request in plan.requests}
    pairs: list[tuple[int, int, int]] = []  # (planned, served, template)
    for record in sorted(records, key=lambda r: r.send_s):
        request = planned_by_id.get(record.id)  # recycled rounds carry a salt: not checked
        if request is None or not record.ok or record.prompt_tokens is None:
            continue
        overhead = overheads.get(request.endpoint)
        if overhead is None:
            continue
        template = overhead.tokens(_messages(request))
        pairs.append((request.prompt_tokens + template, record.prompt_tokens, template))
        if len(pairs) == first:
            break
    if not pairs:
        return None
    errors = [abs(served - planned) / max(planned, 1) for planned, served, _ in pairs]
    bad = [(p, s) for p, s, _ in pairs if abs(s - p) > _allowed(p)]
    planned_total = sum(p for p, _, _ in pairs)
    served_total = sum(s for _, s, _ in pairs)
    if bad:
        ratio = statistics.median(s / max(p, 1) for p, s in bad)
        message = (
            f"prompt tokens: the server counted {served_total} where the plan says "
            f"{planned_total} (tokens in {plan.token_space!r}, chat template included) on the "
            f"first {len(pairs)} requests; {len(bad)} differ by more than "
            f"{TOLERANCE:.0%} (median served/planned {ratio:.2f}): this trial measured "
            "differently sized prompts than the workload file describes"
        )
    else:
        message = (
            f"prompt tokens: the server counted {served_total}, the plan {planned_total} on the "
            f"first {len(pairs)} requests (within {TOLERANCE:.0%})"
        )
    return TokenCheck(
        token_space=plan.token_space,
        checked=len(pairs),
        mismatched=len(bad),
        planned_tokens=planned_total,
        served_tokens=served_total,
        template_tokens=sum(t for _, _, t in pairs),
        worst_error=round(max(errors), 4),
        message=message,
    )
