"""Tool definitions as a chat template writes them into the prompt.

vLLM's Anthropic endpoint turns each Anthropic tool (``name``, ``description``,
``input_schema``) into an OpenAI function tool, and the chat template (Qwen's,
of the ChatML family) writes the tool list into the system message: the system
text, a fixed preamble, one JSON object per tool, a fixed postamble. With no
system message the template opens one for the tools alone.

The simulator counts this text as prompt tokens (``/v1/chat/completions`` and
``/v1/messages`` alike), and the recorder writes the same text into a
recording's system prompt, so a recorded request replays at the size it had live.
"""

from __future__ import annotations

import json
from typing import Any

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def openai_tool(tool: Any) -> Any:
    """An OpenAI function tool; Anthropic tools converted as vLLM's Anthropic endpoint does."""
    if not isinstance(tool, dict) or "function" in tool:
        return tool
    function = {
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool.get("input_schema"),
    }
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def tools_text(tools: Any) -> str | None:
    """The tool block the template adds to the system message; None without tools."""
    if not isinstance(tools, list) or not tools:
        return None
    lines = "".join("\n" + json.dumps(openai_tool(tool), ensure_ascii=False) for tool in tools)
    return TOOLS_PREAMBLE + lines + TOOLS_POSTAMBLE


def system_with_tools(system: str | None, tools: Any) -> str | None:
    """The system message's text once the template has added the tools to it."""
    block = tools_text(tools)
    if block is None:
        return system
    return f"{system}\n\n{block}" if system else block
