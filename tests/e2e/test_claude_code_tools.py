"""Tool definitions count as prompt tokens on the simulator process, as vLLM's template puts them.

The request is a real one: Claude Code 2.1.197 run headless (``claude -p``)
against the simulator, captured on the wire (tests/fixtures/claude_code/).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from autotune.workload.chat_tools import openai_tool, tools_text
from tests.e2e.conftest import claude_code_request

pytestmark = pytest.mark.timeout(90)


def _anthropic_count(url: str, body: dict[str, Any]) -> int:
    response = httpx.post(f"{url}/v1/messages/count_tokens?beta=true", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["input_tokens"]


def _tokenize(url: str, body: dict[str, Any]) -> int:
    response = httpx.post(f"{url}/tokenize", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["count"]


def test_claude_code_tools_count_on_the_anthropic_endpoint(long_sim_url: str) -> None:
    body = claude_code_request()
    assert len(body["tools"]) >= 12
    with_tools = _anthropic_count(long_sim_url, body)
    without = _anthropic_count(long_sim_url, {**body, "tools": []})
    block = _tokenize(long_sim_url, {"prompt": tools_text(body["tools"])})
    # The template's tool block, give or take the separator before it.
    assert abs((with_tools - without) - block) <= 2
    # Claude Code's 24 tools are most of its first request.
    assert (with_tools - without) / with_tools > 0.5
    streamed = httpx.post(
        f"{long_sim_url}/v1/messages?beta=true", json={**body, "stream": False, "max_tokens": 1}
    )
    assert streamed.json()["usage"]["input_tokens"] == with_tools


def test_openai_tools_count_like_the_same_anthropic_tools(long_sim_url: str) -> None:
    body = claude_code_request()
    messages = [{"role": "system", "content": "You are a coding agent."}]
    messages.append({"role": "user", "content": "list the files"})
    openai_tools = [openai_tool(tool) for tool in body["tools"]]
    with_tools = _tokenize(long_sim_url, {"messages": messages, "tools": openai_tools})
    without = _tokenize(long_sim_url, {"messages": messages})
    anthropic = {"system": "You are a coding agent.", "messages": messages[1:]}
    anthropic_with = _anthropic_count(long_sim_url, {**anthropic, "tools": body["tools"]})
    anthropic_without = _anthropic_count(long_sim_url, anthropic)
    assert with_tools - without == anthropic_with - anthropic_without > 0
    # No system message: the template opens one for the tools alone.
    bare = _tokenize(long_sim_url, {"messages": messages[1:], "tools": openai_tools})
    assert bare > _tokenize(long_sim_url, {"messages": messages[1:]}) + (with_tools - without) // 2
