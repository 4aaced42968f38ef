from __future__ import annotations

import json
from pathlib import Path

from autotune.workload import load_plan, write_workload
from autotune.workload.builder import ObservedCall, WorkloadBuilder
from autotune.workload.render import render_anthropic, render_openai_chat
from autotune.workload.schema import DeltaInput, FullInput, SynthPart
from autotune.workload.sse import summarize_response


def _chat(*turns: tuple[str, str], system: str = "sys") -> ObservedCall:
    messages = [{"role": "system", "content": system}]
    messages += [{"role": role, "content": text} for role, text in turns]
    return ObservedCall(render_openai_chat({"messages": messages}), "s", 0.0, 1.0, 4)


def test_rewind_becomes_keep_messages_and_other_system_another_thread(tmp_path: Path) -> None:
    builder = WorkloadBuilder(name="t")
    builder.add(_chat(("user", "a b")))
    builder.add(_chat(("user", "a b"), ("assistant", "r1"), ("user", "c")))
    builder.add(_chat(("user", "a b"), ("assistant", "r1"), ("user", "d e")))  # rewind to 2
    builder.add(_chat(("user", "title?"), system="other"))
    workload = builder.workload()
    first, second, third, fourth = workload.requests
    assert isinstance(second.input, DeltaInput) and second.input.keep_messages is None
    assert first.output.text == "r1"  # the response as the client sent it back
    assert isinstance(third.input, DeltaInput)
    assert third.parent == second.id and third.input.keep_messages == 2
    assert isinstance(fourth.input, FullInput) and fourth.thread != first.thread
    out = tmp_path / "w.jsonl"
    write_workload(out, workload.records())
    plan = {r.id: r for r in load_plan(out).requests}
    assert [m.text for m in plan[third.id].messages] == ["a b", "r1", "d e"]


def test_anonymize_keeps_counts_and_sharing_but_no_text(tmp_path: Path) -> None:
    builder = WorkloadBuilder(name="t", anonymize=True)
    shared = "shared system prompt"
    builder.add(_chat(("user", "secret one two"), system=shared))
    builder.add(
        _chat(("user", "secret one two"), ("assistant", "ok"), ("user", "3"), system=shared)
    )
    other_session = render_openai_chat(
        {"messages": [{"role": "system", "content": shared}, {"role": "user", "content": "new"}]}
    )
    builder.add(ObservedCall(other_session, "s2", 5.0))
    workload = builder.workload()
    out = tmp_path / "anon.jsonl"
    write_workload(out, workload.records())
    assert "secret" not in out.read_text() and "shared" not in out.read_text()
    assert len(workload.prefixes) == 1  # both sessions share one synthetic prefix
    prefix = next(iter(workload.prefixes.values()))
    (part,) = prefix.system
    assert isinstance(part, SynthPart) and part.tokens == 3 and len(part.hash_ids or []) == 1
    a, b, c = load_plan(out).requests
    assert a.system == c.system  # identical synthetic text: the prefix is still shared
    assert a.prompt_tokens == 3 + 3 and b.messages[0] is a.messages[0]


def test_render_anthropic_strips_billing_header_and_renders_tools() -> None:
    call = render_anthropic(
        {
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2; cch=1;"},
                {"type": "text", "text": "You are Claude Code."},
            ],
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm"},
                        {"type": "tool_use", "name": "Read", "input": {"path": "a"}},
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "content": [
                    {"type": "text", "text": "file body"}]}]},
            ],
        }
    )  # fmt: skip
    assert call.system is not None
    assert call.system.startswith("You are Claude Code.\n\n# Tools\n")
    assert '"name": "Read"' in call.system and "billing" not in call.system
    assert call.messages[1] == ("assistant", 'hmm\n{"input": {"path": "a"}, "tool_use": "Read"}')
    assert call.messages[2] == ("user", "file body")


def test_summarize_anthropic_and_openai_streams() -> None:
    anthropic = b"".join(
        b"event: x\ndata: " + json.dumps(event).encode() + b"\n\n"
        for event in [
            {"type": "message_start", "message": {"usage": {"input_tokens": 50,
                                                             "cache_read_input_tokens": 32}}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hel"}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "lo"}},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"output_tokens": 2}},
        ]
    )  # fmt: skip
    summary = summarize_response(anthropic)
    assert (summary.text, summary.output_tokens, summary.input_tokens) == ("Hello", 2, 50)
    assert summary.cached_tokens == 32 and summary.stop == "end_turn"
    openai = (
        b'data: {"choices":[{"delta":{"content":"a "},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"b"},"finish_reason":"length"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,'
        b'"prompt_tokens_details":{"cached_tokens":4}}}\n\ndata: [DONE]\n\n'
    )
    summary = summarize_response(openai)
    assert (summary.text, summary.output_tokens, summary.cached_tokens) == ("a b", 2, 4)
    assert summary.stop == "length"
    body = b'{"choices":[{"message":{"content":"whole"}}],"usage":{"completion_tokens":1}}'
    assert summarize_response(body).text == "whole"
    assert summarize_response(b"garbage\n\ndata: {oops").output_tokens is None
