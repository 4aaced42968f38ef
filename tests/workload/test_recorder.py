"""The recording proxy's recorder: relayed exchanges in, workload entries out, off the loop."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from autotune.workload import read_workload
from autotune.workload.recorder import Exchange, Recorder, observed_call
from autotune.workload.schema import DeltaInput

SESSION = "5f1e-session"


def _sse(words: list[str], completion_tokens: int) -> bytes:
    events = [
        {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
        for word in words
    ]
    usage = {"prompt_tokens": 7, "completion_tokens": completion_tokens}
    events.append({"choices": [], "usage": usage})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + (
        b"data: [DONE]\n\n"
    )


def _exchange(messages: list[dict[str, str]], stream: bytes, *, piece_bytes: int) -> Exchange:
    """An exchange whose stream was relayed in ``piece_bytes`` pieces (cut mid-event)."""
    body = {"model": "m", "stream": True, "messages": messages}
    exchange = Exchange(
        endpoint="openai.chat",
        raw_body=json.dumps(body).encode(),
        session_header=SESSION,
        start_s=1_700_000_000.0,
        start_perf=100.0,
        first_byte_perf=100.25,
        end_perf=101.0,
    )
    exchange.chunks = [stream[i : i + piece_bytes] for i in range(0, len(stream), piece_bytes)]
    return exchange


def test_observed_call_reads_a_stream_cut_at_any_byte() -> None:
    stream = _sse(["Hello", " there", " friend"], completion_tokens=3)
    whole = observed_call(_exchange([{"role": "user", "content": "hi"}], stream, piece_bytes=10**6))
    cut = observed_call(_exchange([{"role": "user", "content": "hi"}], stream, piece_bytes=7))
    assert whole is not None and cut is not None
    assert cut.output_text == whole.output_text == "Hello there friend"
    assert cut.output_tokens == 3
    assert cut.session_key == SESSION
    assert cut.expect == {"e2e_s": 1.0, "first_byte_s": 0.25, "input_tokens": 7}
    assert cut.end_s == 1_700_000_001.0


def test_recorder_records_off_the_calling_thread_and_writes_on_close(tmp_path: Path) -> None:
    out = tmp_path / "rec.jsonl"
    recorder = Recorder(out)
    threads: set[int] = set()
    original_add = recorder.builder.add

    def add_and_note_thread(observed: object) -> None:
        threads.add(threading.get_ident())
        original_add(observed)  # type: ignore[arg-type]

    recorder.builder.add = add_and_note_thread  # type: ignore[method-assign]
    turn1 = [{"role": "user", "content": "hello there"}]
    recorder.submit(_exchange(turn1, _sse(["Hi", "!"], 2), piece_bytes=5), status=200)
    turn2 = [*turn1, {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "ok"}]
    recorder.submit(_exchange(turn2, _sse(["Fine"], 1), piece_bytes=5), status=200)
    recorder.submit(_exchange(turn2, b'{"error": "overloaded"}', piece_bytes=5), status=529)
    bad = _exchange(turn1, _sse(["x"], 1), piece_bytes=5)
    bad.raw_body = b"not json"
    recorder.submit(bad, status=200)
    recorder.submit_skip()
    recorder.close()

    assert threads and threading.get_ident() not in threads
    assert (recorder.recorded, recorder.skipped) == (2, 3)
    first, second = read_workload(out).requests
    assert first.session == second.session == SESSION
    assert isinstance(second.input, DeltaInput) and second.parent == first.id
    assert first.output.tokens == 2 and first.output.text == "Hi!"
    assert [p.name for p in tmp_path.iterdir()] == ["rec.jsonl"]  # no temp file left behind


def test_recorder_close_without_calls_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "empty.jsonl"
    recorder = Recorder(out)
    recorder.submit_flush()
    recorder.close()
    assert not out.exists()
    assert (recorder.recorded, recorder.skipped) == (0, 0)
