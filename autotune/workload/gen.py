"""Workload generators: Claude Code agent sessions, independent chat, fixed-size requests.

The Claude Code model follows published statistics of Claude Code traces
(TraceLab, uw-syfi/TraceLab, and the kv-cache-tester traces,
callanjfox/kv-cache-tester; docs/workload-format.md): a shared system + tools
prefix, ~650-860 new tokens per tool step (medians of the two), outputs of
median ~220 tokens, ~8 tool steps per user request,
human gaps of minutes and tool gaps of seconds, and occasional subagents that
run as child threads beside their parent. All content is synthetic and token
counted; arrival times assume ``DECODE_TOKENS_PER_S`` to place later turns.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from autotune.workload.io import Workload
from autotune.workload.plan import Endpoint
from autotune.workload.schema import (
    FORMAT_VERSION,
    DeltaInput,
    FullInput,
    Header,
    Output,
    PrefixRecord,
    RequestRecord,
    SynthPart,
    WireMessage,
)

DECODE_TOKENS_PER_S = 40.0  # only used to estimate recorded arrival times
MAIN_PREFIX = "cc.main"
SUBAGENT_PREFIX = "cc.subagent"


def _lognormal(rng: random.Random, median: float, sigma: float, low: float, high: float) -> float:
    return min(high, max(low, rng.lognormvariate(math.log(median), sigma)))


def _tokens(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return round(_lognormal(rng, median, sigma, low, high))


def _user(tokens: int) -> list[WireMessage]:
    return [WireMessage(role="user", content=[SynthPart(tokens=tokens)])]


@dataclass(frozen=True)
class ClaudeCodeParams:
    """Knobs of the Claude Code generator (token counts in the plan's token space)."""

    sessions: int = 16
    seed: int = 0
    user_turns: int = 3  # user requests per session
    tool_steps_mean: float = 8.0  # tool-driven steps per user request
    requests_per_session: int | None = None  # cap on all requests of a session
    prefix_tokens: int = 18_000  # shared system prompt + tool definitions
    subagent_prefix_tokens: int = 8_500
    max_context: int | None = 128_000  # a session ends before its prompt would exceed this
    subagent_rate: float = 0.25  # probability that a user request spawns subagents
    session_stagger_s: float = 10.0  # recorded start offset between sessions
    endpoint: Endpoint = "openai.chat"


@dataclass
class _Session:
    rng: random.Random
    params: ClaudeCodeParams
    name: str
    start_s: float
    requests: list[RequestRecord] = field(default_factory=list)
    done_s: dict[str, float] = field(default_factory=dict)

    def room(self) -> bool:
        cap = self.params.requests_per_session
        return cap is None or len(self.requests) < cap

    def fits(self, context: int) -> bool:
        cap = self.params.max_context
        return cap is None or context <= cap

    def add(
        self, request_id: str, thread: str, parent: str | None, after: list[str], gap_s: float,
        spec: DeltaInput | FullInput, prefix: str | None, output_tokens: int, context: int,
    ) -> None:  # fmt: skip
        t_s = max((self.done_s[dep] for dep in after), default=self.start_s) + gap_s
        self.requests.append(
            RequestRecord(
                id=request_id,
                session=self.name,
                thread=thread,
                parent=parent,
                after=None if after == ([parent] if parent else []) else after,
                gap_s=round(gap_s, 3),
                t_s=round(t_s, 3),
                prefix=prefix,
                input=spec,
                output=Output(tokens=output_tokens),
                input_tokens=context,
            )
        )
        self.done_s[request_id] = t_s + 0.5 + output_tokens / DECODE_TOKENS_PER_S


def _output(rng: random.Random) -> int:
    return _tokens(rng, 220, 1.0, 8, 4_000)


def _subagent(session: _Session, spawner: str, index: int) -> str | None:
    """Run one subagent thread after ``spawner``; returns its last request id."""
    rng, params = session.rng, session.params
    thread = f"sa:{index}"
    task = _tokens(rng, 400, 0.6, 50, 3_000)
    context = params.subagent_prefix_tokens + task
    if not session.room() or not session.fits(context):
        return None
    first = f"{session.name}.a{index}.r00"
    output = _output(rng)
    spec = FullInput(messages=_user(task))
    session.add(first, thread, None, [spawner], 0.5, spec, SUBAGENT_PREFIX, output, context)
    last = first
    for step in range(1, rng.randint(3, 8)):
        append = _tokens(rng, 750, 1.2, 20, 16_000)
        if not session.room() or not session.fits(context + output + append):
            break
        context += output + append
        request_id = f"{session.name}.a{index}.r{step:02d}"
        gap_s = _lognormal(rng, 1.5, 1.2, 0.1, 60)
        output = _output(rng)
        delta = DeltaInput(append=_user(append))
        session.add(request_id, thread, last, [last], gap_s, delta, None, output, context)
        last = request_id
    return last


def _claudecode_session(params: ClaudeCodeParams, index: int, rng: random.Random) -> _Session:
    session = _Session(rng, params, f"s{index:02d}", index * params.session_stagger_s)
    first_user = _tokens(rng, 2_000, 0.7, 200, 8_000)
    context = params.prefix_tokens + first_user
    if not session.fits(context):
        return session
    output = _output(rng)
    previous = f"{session.name}.r000"
    spec: DeltaInput | FullInput = FullInput(messages=_user(first_user))
    session.add(previous, "main", None, [], 0.0, spec, MAIN_PREFIX, output, context)
    number = 0
    subagents = 0
    for turn in range(params.user_turns):
        steps = 1 + min(40, int(rng.expovariate(1 / params.tool_steps_mean)))
        spawn_at = rng.randrange(steps) if rng.random() < params.subagent_rate else -1
        for step in range(steps):
            if turn == 0 and step == 0:
                continue  # the session's first request, above
            joined: list[str] = []
            if step - 1 == spawn_at:
                for _ in range(1 if rng.random() < 0.75 else 2):
                    last = _subagent(session, previous, subagents)
                    subagents += 1
                    if last is not None:
                        joined.append(last)
            if step == 0:
                append = _tokens(rng, 300, 1.0, 5, 8_000)
                gap_s = _lognormal(rng, 84, 1.5, 5, 1_800)  # a human reads and types
            else:
                append = _tokens(rng, 750, 1.2, 20, 16_000)  # tool results
                gap_s = _lognormal(rng, 1.5, 1.2, 0.1, 60)
            if not session.room() or not session.fits(context + output + append):
                return session
            context += output + append
            number += 1
            request_id = f"{session.name}.r{number:03d}"
            output = _output(rng)
            delta = DeltaInput(append=_user(append))
            after = [previous, *joined]
            session.add(request_id, "main", previous, after, gap_s, delta, None, output, context)
            previous = request_id
    return session


def claudecode(params: ClaudeCodeParams) -> Workload:
    """Claude Code-like agent sessions sharing one system + tools prefix."""
    rng = random.Random(params.seed)
    requests: list[RequestRecord] = []
    for index in range(params.sessions):
        requests.extend(_claudecode_session(params, index, rng).requests)
    prefixes = {
        MAIN_PREFIX: PrefixRecord(id=MAIN_PREFIX, system=[SynthPart(tokens=params.prefix_tokens)]),
        SUBAGENT_PREFIX: PrefixRecord(
            id=SUBAGENT_PREFIX, system=[SynthPart(tokens=params.subagent_prefix_tokens)]
        ),
    }
    used = {request.prefix for request in requests}
    header = Header(
        version=FORMAT_VERSION,
        name="claudecode",
        endpoint=params.endpoint,
        seed=params.seed,
        source={"generator": "claudecode", **_params_dict(params)},
    )
    return Workload(header, {k: v for k, v in prefixes.items() if k in used}, requests)


def _params_dict(params: object) -> dict[str, object]:
    return {key: value for key, value in vars(params).items() if value is not None}


@dataclass(frozen=True)
class ChatParams:
    """Independent chat requests with Poisson arrivals."""

    requests: int = 200
    seed: int = 0
    rate_rps: float = 2.0
    prompt_tokens_median: int = 800
    output_tokens_median: int = 250
    system_tokens: int = 0  # a system prompt shared by every request (0: none)
    endpoint: Endpoint = "openai.chat"


def chat(params: ChatParams) -> Workload:
    """Independent single-turn chat requests (lognormal lengths, Poisson arrivals)."""
    rng = random.Random(params.seed)
    prefixes: dict[str, PrefixRecord] = {}
    prefix = None
    if params.system_tokens:
        prefix = "chat.system"
        prefixes[prefix] = PrefixRecord(id=prefix, system=[SynthPart(tokens=params.system_tokens)])
    requests: list[RequestRecord] = []
    t_s = 0.0
    for index in range(params.requests):
        prompt = _tokens(rng, params.prompt_tokens_median, 0.8, 4, 32_000)
        output = _tokens(rng, params.output_tokens_median, 0.8, 4, 4_000)
        requests.append(
            RequestRecord(
                id=f"c{index:05d}",
                t_s=round(t_s, 3),
                prefix=prefix,
                input=FullInput(messages=_user(prompt)),
                output=Output(tokens=output),
                input_tokens=prompt + params.system_tokens,
            )
        )
        t_s += rng.expovariate(params.rate_rps)
    header = Header(
        version=FORMAT_VERSION,
        name="chat",
        endpoint=params.endpoint,
        seed=params.seed,
        source={"generator": "chat", **_params_dict(params)},
    )
    return Workload(header, prefixes, requests)


def fixed(
    *, requests: int, prompt_tokens: int, output_tokens: int, endpoint: Endpoint = "openai.chat"
) -> Workload:
    """``requests`` independent requests of exactly ``prompt_tokens`` in and
    ``output_tokens`` out, all arriving at once (a hand-run concurrency benchmark)."""
    records = [
        RequestRecord(
            id=f"f{index:05d}",
            t_s=0.0,
            input=FullInput(messages=_user(prompt_tokens)),
            output=Output(tokens=output_tokens),
            input_tokens=prompt_tokens,
        )
        for index in range(requests)
    ]
    header = Header(
        version=FORMAT_VERSION,
        name="fixed",
        endpoint=endpoint,
        source={
            "generator": "fixed",
            "requests": requests,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
        },
    )
    return Workload(header, {}, records)
