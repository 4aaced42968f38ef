"""Read what a vLLM server (real or simulated) says in its log.

``parse_startup_log`` turns the startup lines into a ``StartupReport``;
``parse_engine_stats`` reads the periodic ``Engine 000: ...`` lines;
``classify_failure`` names why a server did not start or died, keeping the
decisive line and its context. The patterns accept the wording of vLLM 0.26
through 0.33 (old two-line KV capacity, the 0.26 memory summary, "models's")
and of the simulator, which copies vLLM's texts.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from autotune.redaction import redact
from autotune.sim.model.units import GIB
from autotune.vocabulary import Failure, FailureClass, StartupReport

Phase = Literal["startup", "serving"]

EXCERPT_LINES_BEFORE = 12
EXCERPT_LINES_AFTER = 4
TAIL_LINES = 40
MESSAGE_MAX_CHARS = 400
AUTOTUNE_LINE_PREFIX = "# autotune: "  # lines autotune writes at the head of a server log

# "(EngineCore pid=123) ERROR 11-30 01:14:47 [core.py:1510] " (vllm/logger.py format)
_PREFIX = re.compile(r"^\((?P<proc>[\w-]+) pid=\d+\) (?P<level>[A-Z]+) [\d-]+ [\d:]+ \[[^\]]*\] ")

_NUMBER = r"([\d.]+)"
_STARTUP_PATTERNS = {
    "version_banner": re.compile(r"vLLM (?:API )?server version ([^\s,]+)"),
    "version_logo": re.compile(r"\bversion (\d+\.\d+\S*)\s*$", re.MULTILINE),
    "version_engine": re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\)"),
    "kv_tokens": re.compile(r"(?:(\w+)(?: \+ \w+)? )?KV cache size: ([\d,]+) tokens"),
    "concurrency": re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
    "block_size": re.compile(r"Setting attention block size to (\d+) tokens"),
    "model_loading": re.compile(
        r"Model loading took ([\d.]+) GiB (?:memory )?and ([\d.]+) seconds"
    ),
    "weights_loading": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "graph_capture": re.compile(r"Graph capturing finished in ([\d.]+) secs, took ([\d.]+) GiB"),
    "kv_available": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "kv_reserved": re.compile(r"reserved ([\d.]+) GiB memory for KV Cache"),
    "kv_cpu_explicit": re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache"),
    "kv_in_use_gib": re.compile(r"Current kv cache memory in use is ([\d.]+) GiB"),
    "kv_in_use_bytes": re.compile(r"Current kv cache memory in use is (\d+) bytes"),
    # 0.26-era summary: "Actual usage is A GiB for weight, B GiB for peak activation,
    # C GiB for non-torch memory, and D GiB for CUDAGraph memory."
    "weight_old": re.compile(rf"{_NUMBER} GiB for weight\b"),
    "non_torch": re.compile(rf"{_NUMBER} GiB for non-torch memory"),
    # 0.33: "Actual usage is A GiB for consumed memory (weights + non-torch), B GiB ..."
    "consumed": re.compile(rf"{_NUMBER} GiB for consumed memory"),
    "peak_activation": re.compile(rf"{_NUMBER} GiB for peak activation"),
    "cudagraph_summary": re.compile(rf"{_NUMBER} GiB for CUDAGraph memory"),
}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _first(name: str, text: str) -> re.Match[str] | None:
    return _STARTUP_PATTERNS[name].search(text)


def parse_startup_log(text: str) -> StartupReport:
    """Parse a (possibly partial) vLLM startup log into a ``StartupReport``.

    Missing lines leave their fields ``None``; ``ready_s`` is the launcher's to fill.
    For 0.33's summary, which lumps weights with non-torch memory, ``non_torch_gib``
    is that sum minus the weights from "Model loading took ..." when both are logged.
    """
    fields: dict[str, object] = {}
    version = (
        _first("version_banner", text)
        or _first("version_engine", text)
        or _first("version_logo", text)
    )
    if version:
        fields["engine_version"] = version.group(1)
    if match := _first("kv_tokens", text):
        fields["device"] = match.group(1)
        fields["kv_cache_tokens"] = int(_number(match.group(2)))
    if match := _first("concurrency", text):
        fields["max_concurrency_tokens_per_request"] = int(_number(match.group(1)))
        fields["max_concurrency"] = _number(match.group(2))
    if match := _first("block_size", text):
        fields["attention_block_size"] = int(match.group(1))
    if match := _first("model_loading", text):
        fields["weights_gib"] = float(match.group(1))
        fields["model_load_s"] = float(match.group(2))
    elif match := _first("weights_loading", text):
        fields["model_load_s"] = float(match.group(1))
    if "weights_gib" not in fields and (match := _first("weight_old", text)):
        fields["weights_gib"] = float(match.group(1))
    if match := _first("peak_activation", text):
        fields["peak_activation_gib"] = float(match.group(1))
    if match := _first("non_torch", text):
        fields["non_torch_gib"] = float(match.group(1))
    elif (match := _first("consumed", text)) and "weights_gib" in fields:
        consumed = float(match.group(1)) - float(fields["weights_gib"])  # type: ignore[arg-type]
        fields["non_torch_gib"] = round(max(consumed, 0.0), 4)
    if match := _first("graph_capture", text):
        fields["graph_capture_s"] = float(match.group(1))
        fields["cudagraph_gib"] = float(match.group(2))
    elif match := _first("cudagraph_summary", text):
        fields["cudagraph_gib"] = float(match.group(1))
    kv_gib = _kv_cache_gib(text)
    if kv_gib is not None:
        fields["kv_cache_gib"] = kv_gib
    return StartupReport.model_validate(fields)


def _kv_cache_gib(text: str) -> float | None:
    for name in ("kv_available", "kv_reserved", "kv_cpu_explicit", "kv_in_use_gib"):
        if match := _first(name, text):
            return float(match.group(1))
    if match := _first("kv_in_use_bytes", text):
        return round(int(match.group(1)) / GIB, 4)
    return None


class EngineStats(BaseModel):
    """One periodic ``Engine 000: Avg prompt throughput: ...`` log line."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    running: int
    waiting: int
    kv_cache_usage: float  # fraction 0..1
    prefix_cache_hit_rate: float | None = None  # fraction 0..1
    external_prefix_cache_hit_rate: float | None = None  # fraction 0..1 (LMCache)


_ENGINE_STATS = re.compile(
    r"Engine \d+: Avg prompt throughput: ([\d.]+) tokens/s, "
    r"Avg generation throughput: ([\d.]+) tokens/s, "
    r"Running: (\d+) reqs, Waiting: (\d+) reqs, \w+ KV cache usage: ([\d.]+)%"
    r"(?:, Prefix cache hit rate: ([\d.]+)%)?"
    r"(?:, External prefix cache hit rate: ([\d.]+)%)?"
)


def parse_engine_stats(text: str) -> list[EngineStats]:
    """Every periodic engine stats line in ``text``, in order."""
    stats = []
    for match in _ENGINE_STATS.finditer(text):
        prefix, external = match.group(6), match.group(7)
        stats.append(
            EngineStats(
                prompt_tokens_per_s=float(match.group(1)),
                generation_tokens_per_s=float(match.group(2)),
                running=int(match.group(3)),
                waiting=int(match.group(4)),
                kv_cache_usage=float(match.group(5)) / 100,
                prefix_cache_hit_rate=None if prefix is None else float(prefix) / 100,
                external_prefix_cache_hit_rate=None if external is None else float(external) / 100,
            )
        )
    return stats


# Ordered: the first class whose pattern matches wins. A CUDA OOM during serving is
# followed by EngineCore's fatal error and EngineDeadError, so OOM is checked before death.
_PORT_IN_USE = re.compile(r"Address already in use|\[Errno 98\]")
_ARGPARSE = re.compile(r"error: (?:argument |unrecognized arguments|the following arguments)")
_KV_DOES_NOT_FIT = re.compile(
    r"No available memory for the cache blocks"
    r"|To serve at least one request with the models?'s max seq len"
    r"|Cannot auto-fit max_model_len"
    r"|exceeds available Mamba cache blocks"
)
_CUDA_OOM = re.compile(
    r"torch\.(?:cuda\.)?OutOfMemoryError"
    r"|CUDA out of memory\. Tried to allocate"
    r"|Failed to load model - not enough GPU memory"
    r"|on startup is less than desired (?:GPU|CPU) memory utilization"
)
_UNSUPPORTED = re.compile(
    r"ValidationError|validation errors? for \w+"
    r"|Invalid kv_cache_dtype|Unknown quantization method"
    r"|NotImplementedError|ValueError: |is not supported"
)
_ENGINE_DEAD = re.compile(
    r"EngineCore encountered a fatal error"
    r"|EngineDeadError"
    r"|AsyncLLM output_handler failed"
    r"|engine core exited unexpectedly"
    r"|Worker proc \S+ died unexpectedly"
)
# torch's CUDA OOM names every other process holding memory on the device.
_OTHER_PROCESS_MEMORY = re.compile(r"Process (\d+) has ([\d.]+ [KMG]iB) memory in use")
_STARTUP_HANG = re.compile(r"Timed out waiting for engine core processes to start")
_STARTUP_FATAL = re.compile(
    r"EngineCore failed to start|WorkerProc failed|Engine core initialization failed"
)
# After this line the server is shutting down on request; EngineDeadError that follows
# is the shutdown's echo, not a death (seen in real 0.32 logs after SIGTERM).
_SHUTDOWN = re.compile(r"\[shutdown\] API server: shutdown triggered")


class _Hit(NamedTuple):
    line_index: int
    message: str


def _clean(line: str) -> str:
    return _PREFIX.sub("", line).strip()[:MESSAGE_MAX_CHARS]


def _find(pattern: re.Pattern[str], lines: list[str]) -> _Hit | None:
    for index, line in enumerate(lines):
        if pattern.search(line):
            return _Hit(line_index=index, message=_clean(line))
    return None


def _server_lines(text: str) -> list[str]:
    """The log's lines minus autotune's own header lines (the argv could match anything)."""
    return [line for line in text.splitlines() if not line.startswith(AUTOTUNE_LINE_PREFIX)]


def _excerpt(lines: list[str], index: int) -> str:
    start = max(index - EXCERPT_LINES_BEFORE, 0)
    return "\n".join(lines[start : index + EXCERPT_LINES_AFTER + 1])


def _tail(lines: list[str]) -> str:
    return "\n".join(lines[-TAIL_LINES:])


def _before_shutdown(lines: list[str]) -> list[str]:
    for index, line in enumerate(lines):
        if _SHUTDOWN.search(line):
            return lines[:index]
    return lines


def classify_failure(
    log_text: str,
    *,
    exit_code: int | None,
    health_status: int | None,
    phase: Phase,
) -> Failure:
    """Name why a server failed, from its log, exit code and last ``/health`` status.

    ``exit_code`` is None while the process still runs (for a startup, that means the
    launcher gave up waiting: a hang). ``health_status`` 503 means the engine is dead.
    The exit code alone is never trusted: vLLM may exit 0 after an engine death.
    Secrets in the log (a key a server echoed) are redacted from the message and excerpt.
    """
    lines = _server_lines(log_text)

    def failure(failure_class: FailureClass, hit: _Hit | None, message: str = "") -> Failure:
        return Failure(
            failure_class=failure_class,
            message=redact(hit.message if hit else message),
            log_excerpt=redact(_excerpt(lines, hit.line_index) if hit else _tail(lines)),
            exit_code=exit_code,
        )

    if hit := _find(_PORT_IN_USE, lines):
        return failure(FailureClass.PORT_IN_USE, hit)
    if exit_code == 2 or (phase == "startup" and _find(_ARGPARSE, lines)):
        hit = _find(_ARGPARSE, lines)
        return failure(FailureClass.INVALID_ARGS, hit, f"arguments rejected (exit {exit_code})")
    if hit := _find(_KV_DOES_NOT_FIT, lines):
        return failure(FailureClass.KV_DOES_NOT_FIT, hit)
    if hit := _find(_CUDA_OOM, lines):
        if phase == "serving":
            return failure(FailureClass.CUDA_OOM_LOAD, hit)
        return failure(FailureClass.CUDA_OOM_STARTUP, hit)
    if phase == "startup":
        if hit := _find(_UNSUPPORTED, lines):
            return failure(FailureClass.UNSUPPORTED_CONFIG, hit)
        if hit := _find(_STARTUP_HANG, lines):
            return failure(FailureClass.STARTUP_TIMEOUT, hit)
        if hit := _find(_STARTUP_FATAL, lines):
            return failure(FailureClass.UNKNOWN, hit)
        if exit_code is None:
            return failure(FailureClass.STARTUP_TIMEOUT, None, "server never became ready")
        return failure(FailureClass.UNKNOWN, None, f"server exited with code {exit_code}")
    if hit := _find(_ENGINE_DEAD, _before_shutdown(lines)):
        return failure(FailureClass.ENGINE_DEAD, hit)
    if health_status == 503:
        return failure(FailureClass.ENGINE_DEAD, None, "/health answered 503 while serving")
    if exit_code is not None:
        return failure(
            FailureClass.ENGINE_DEAD, None, f"server exited with code {exit_code} while serving"
        )
    return failure(FailureClass.UNKNOWN, None, "server failed while serving")


def fatal_line(text: str, *, phase: Phase) -> str | None:
    """The first line of ``text`` that already decides a failure, else None.

    Used while waiting for readiness or serving, so a doomed server is given up on as
    soon as vLLM says why rather than at a timeout.
    """
    lines = _server_lines(text)
    patterns = [_PORT_IN_USE, _KV_DOES_NOT_FIT, _CUDA_OOM]
    if phase == "serving":
        lines = _before_shutdown(lines)
        patterns.append(_ENGINE_DEAD)
    else:
        patterns += [_STARTUP_HANG, _STARTUP_FATAL]
    for pattern in patterns:
        if hit := _find(pattern, lines):
            return redact(hit.message)
    return None


def memory_held_elsewhere(failure: Failure) -> str | None:
    """For a startup OOM whose torch message names another process holding GPU memory
    (a previous trial's server not yet gone, or someone else's job): which, and how much.
    """
    if failure.failure_class != FailureClass.CUDA_OOM_STARTUP:
        return None
    found = _OTHER_PROCESS_MEMORY.search(f"{failure.message}\n{failure.log_excerpt}")
    return f"process {found[1]} held {found[2]}" if found else None
