"""Search strategies through the real study loop, against a simulator that is not the truth.

Every strategy runs ``autotune.study.run_study`` (the space, derived flags,
memory pre-screen, objective, constraints, dedup and confirmation of
``autotune run``); only the engine differs: each launch is answered in-process
by the simulator's predictor under the landscape's *truth*, the simulator with
perturbed speed constants (efficiencies, overheads, MTP acceptance; seeded per
landscape), with 3% noise on every measurement. The tuner's own simulator is
the unperturbed one with other random draws (``TRUTH_SEED``), so it never sees
the truth. ``adverse`` truths also make
MTP, large batches and mixed prefill steps worse than the simulator believes.
``readme-misled`` is the README's truth with MTP's later drafts rarely accepted: its
optimum is far down the simulator's ranking. ``readme-chunked`` differs in shape, not
constants (``STRUCTURES``): its throughput falls past 3,000 batched tokens, between two
lattice points. ``cc-traces-24g`` replays 8 real Claude Code sessions (the shared traces;
skipped with a line when they are absent) on a 24 GB card under a truth shifted in named
directions (``TruthShift``: compute slower, MTP accepted more often, memory dearer): its
best config lies in a narrow band of batched tokens just below the truth's OOM, between
the lattice's points, and its rows are scored against a sweep of every lattice row's
batched tokens too (``chunk_sweep``). Each truth's header says how wrong the
tuner's simulator is there: the optimum's rank in its prediction, the distance from the
predicted optimum, and the true value of that and of the baseline (``misled_by``).
The noise is paired: the k-th measurement of a config at one seed draws the same
factor in every strategy (``noise_factor``); each sampler has its own seed
(``sampler_seed``), shared only by the default and its ablations.

``--bench harsh`` (the default; ``--gentle`` or ``--bench both`` for the earlier one):
the truth plans its memory with its own constants (``truth_memory``: activation peak,
CUDA-graph, non-torch and per-sequence memory off by -3% to +8%), so a config the
pre-screen passes can be an OOM launch; every returned figure (throughput, latencies,
acceptance counters, each draft position's among them) draws its own noise, Student-t
tailed with rare outliers, and throughput drifts down slowly over the night; the
landscape's SLO (the README's ``ttft_p95<=20s``) is kept. In both, the warm start is
held to its budget as on a first night on this machine (``warm_started``): the lattice
is predicted once and timed, and a study's guide gets only the configs its warm start
would have predicted in ``warm_start_budget_s`` at that rate (and within its cap per
trial), in its own order.

Figures per landscape, truth and strategy (over seeds): launches to 95% / 99%
of the truth's exhaustive optimum over the lattice (the true, noise-free
value of the config the tool would hand over after that launch; confirmation
launches included), and until the crown stays at 99% to the end; launches per study
(every strategy gets its full budget: ``MAX_TRIALS``) and how many first launches are the
same config in every seed (how far the seeds are independent: the default's baseline and
warm-start seeds come from the predictions alone), OOM launches per study, modelled GPU-hours to 99%
(startup included) and per study, the true value of the final winner and how many
studies launched a config within 1% at all (a miss of the crown, or of the search) and in
how many a crown that knows the noise and drift would hand one over from the same runs
(``oracle_crown``), and under each truth's rows how often an allocator handed the
truth's plateau (the configs within 2% of the best known) crowns within 1% at best
(``handed_plateau``: where it is short of 9 in 10, measuring alone does not get there);
with pruning, trials pruned per study and would-be winners pruned (a pruned config
within 1% of the optimum, or better than what the tool would hand over then).
``--raw`` keeps each launch's config digest, true value and measured throughput, and each
config's launch flags, to read why a crown fell back: ``--trace`` prints them launch by
launch (``--trace-seed`` picks studies). The truth's virtual replay reports its throughput
so far as the HTTP replay does; the study's pruner sees it (noise included) and may stop
the trial: its modelled GPU time is then startup plus the replay up to that point.

    python scripts/bench_tuner.py [--quick] [--seeds 10] [--launches 30] [--json] [--jobs N]
        [--cache FILE] [--raw FILE]     # then: --table FILE... (runs merged, one optimum)
    python scripts/bench_tuner.py --table FILE... --plateau [--cache FILE]  # and the yardstick
    python scripts/bench_tuner.py --trace FILE [--trace-seed 2 7]  # each study's launches
    # a changed copy of the code, set beside the default by --table:
    python scripts/bench_tuner.py --strategy default --raw FILE --variant "threshold 3%"
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import multiprocessing
import os
import pickle
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from scipy.stats import binomtest

from autotune.catalog.hardware import get_gpu
from autotune.catalog.models import get_model
from autotune.config.space import SEARCH_SPACES_DIR, SearchSpace
from autotune.config.trial_config import TrialConfig
from autotune.replay.load import LoadSpec
from autotune.replay.load_policy import Progress
from autotune.replay.records import ReplayStats
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.memory import MemoryPerturbation, plan_memory, torch_oom_text
from autotune.sim.model.speed_constants import DEFAULT_CONSTANTS, SpeedConstants
from autotune.sim.server.flags import parse_serve_args
from autotune.sim.server.startup import startup_phases
from autotune.sim.virtual.predict import Prediction
from autotune.study import StudySpec, run_study
from autotune.study.setup import RunOptions, prepare_study
from autotune.trial.run import TrialResult, derive_config
from autotune.tuner.guide import _ENUMERATIONS, make_encoder
from autotune.tuner.kv_bounds import largest_kv_pool_bytes, shaped
from autotune.tuner.lattice import Candidate, config_key, ladder
from autotune.tuner.predictor import SimOracle, predict_all
from autotune.tuner.settings import TunerSettings
from autotune.tuner.two_tier import predict_two_tier
from autotune.vocabulary import Failure, FailureClass, Outcome, ServerStats
from autotune.workload.gen import ChatParams, ClaudeCodeParams, chat, claudecode
from autotune.workload.importers.dispatch import import_workload
from autotune.workload.io import Workload, write_workload
from autotune.workload.slice import slice_workload

REPO = Path(__file__).resolve().parents[1]
NOISE = 0.03  # run-to-run spread of every measured figure
TAIL_DOF = 3  # the harsh bench's noise: Student-t with this many degrees of freedom ...
OUTLIER_RATE = 0.02  # ... and, this often, a measurement off by up to OUTLIER_SIZE
OUTLIER_SIZE = 0.25
DRIFT_PER_LAUNCH = 0.002  # the harsh bench's slow drift: throughput lost per launch so far
TRUTH_SEED = 1  # the truth's simulator draws MTP acceptance from other streams than the tuner's
# Trials per study without confirmation, launched or not (pre-screened, duplicates): enough
# that every baseline gets its full launch budget (at 90, random studies on the 24 GB
# landscape stopped after 4-11 launches, the pre-screen rejecting most draws).
MAX_TRIALS = 1000


def noise_factor(
    truth: str, seed: int, key: str, k: int, *, figure: str = "", harsh: bool = False
) -> float:
    """The factor on ``figure`` of the ``k``-th measurement (0-based) of config ``key`` in
    study ``seed`` under ``truth``: the same for every strategy, so strategies at one seed
    are paired (a difference between them is not a different noise draw). Gentle: normal,
    ``NOISE`` wide. Harsh: Student-t (``TAIL_DOF``) of the same spread, and now and then an
    outlier; each figure draws its own."""
    rng = random.Random(f"noise:{truth}:{seed}:{key}:{k}{':' + figure if figure else ''}")
    if not harsh:
        return max(0.5, 1.0 + NOISE * rng.gauss(0.0, 1.0))
    chi2 = sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(TAIL_DOF))
    t = rng.gauss(0.0, 1.0) / math.sqrt(chi2 / TAIL_DOF) * math.sqrt((TAIL_DOF - 2) / TAIL_DOF)
    factor = 1.0 + NOISE * t
    if rng.random() < OUTLIER_RATE:
        factor *= 1.0 + rng.uniform(-OUTLIER_SIZE, OUTLIER_SIZE)
    return min(max(0.5, factor), 2.0)


def noised_stats(stats: ReplayStats, draw: Callable[[str], float], drift: float) -> ReplayStats:
    """Every figure of ``stats`` with its own noise (``draw(figure)``); ``drift`` slows
    throughput (and so stretches latency) by that share."""
    rate = draw("throughput") * (1.0 - drift)
    update: dict[str, Any] = {
        "output_throughput_tok_s": stats.output_throughput_tok_s * rate,
        "total_token_throughput_tok_s": stats.total_token_throughput_tok_s * rate,
        "request_throughput_rps": stats.request_throughput_rps * rate,
    }
    if stats.goodput_rps is not None:
        update["goodput_rps"] = stats.goodput_rps * rate
    for name in ("ttft", "tpot", "itl", "e2e"):
        factor = draw(name) / (1.0 - drift)
        latency = getattr(stats, name)
        update[name] = latency.model_copy(
            update={
                field_name: value * factor
                for field_name, value in latency.model_dump().items()
                if value is not None
            }
        )
    return stats.model_copy(update=update)


def noised_server_stats(stats: ServerStats | None, draw: Callable[[str], float]):
    """The server's acceptance counters with their own noise: each draft position's
    accepted share draws its own factor (kept at most the position before it: a deeper
    draft is accepted only after the shallower ones), and the accepted tokens, rate and
    mean length follow them. Recalibration learns from these counters, so one MTP launch
    must not hand over the truth's acceptance exactly."""
    if stats is None or not stats.spec_decode_accepted_tokens or not stats.spec_decode_drafts:
        return stats
    drafts = stats.spec_decode_drafts
    drafted = stats.spec_decode_draft_tokens or 0
    positions = stats.spec_decode_acceptance_per_position
    if positions:
        noised: list[float] = []
        for i, share in enumerate(positions):
            ceiling = noised[-1] if noised else 1.0
            noised.append(min(ceiling, share * draw(f"accepted:{i}")))
        accepted = min(round(sum(noised) * drafts), drafted)
    else:
        noised = []
        accepted = min(round(stats.spec_decode_accepted_tokens * draw("accepted")), drafted)
    return stats.model_copy(
        update={
            "spec_decode_accepted_tokens": accepted,
            "spec_decode_acceptance_rate": accepted / drafted if drafted else None,
            "spec_decode_mean_acceptance_length": 1 + accepted / drafts,
            "spec_decode_acceptance_per_position": tuple(noised) or positions,
        }
    )


def sampler_seed(sampler: str, seed: int) -> int:
    """The sampler's own seed: keyed by the sampler, so random, TPE and GP do not share
    their first random draws at one seed (Optuna's TPE and GP start from a
    RandomSampler with the seed they are given); the default and its ablations (one
    sampler, "guided") share it, and so differ only by the technique switched off."""
    return int.from_bytes(hashlib.sha256(f"{sampler}:{seed}".encode()).digest()[:4], "big")


@dataclass(frozen=True)
class Landscape:
    name: str
    hardware: str
    model: str
    space: Path
    workload: Callable[[Path], Path]  # directory -> the workload file (written there if made)
    load: LoadSpec
    shape_kv: bool = False  # KV range as the run's warning says: a share of the largest pool
    truth_of: str | None = None  # draw the truth's constants as this landscape's do
    mtp_acceptance_factors: tuple[float, ...] = ()  # per draft position, on that draw's
    adverse: bool = True  # also run the adverse truth
    slos: tuple[str, ...] = ()  # the harsh bench's --slo (the gentle one has none)
    structure: str | None = None  # a STRUCTURES entry: the truth differs in shape, not constants
    shift: TruthShift | None = None  # its truth: the catalog's constants shifted so
    chunk_sweep: bool = False  # score against the truth's best along the chunk too


@dataclass(frozen=True)
class TruthShift:
    """A truth wrong in named directions only, in place of the landscape's seeded draw:
    the catalog's speed constants with compute slower and MTP's drafts accepted more
    often, and under the harsh bench every memory-model constant dearer by one factor."""

    compute: float = 1.0  # factor on the compute efficiencies (below 1: slower compute)
    acceptance: float = 1.0  # factor on each draft position's acceptance (capped at 0.98)
    memory: float = 1.0  # factor on the memory model's activation, CUDA-graph, ... memory


class MissingData(Exception):
    """A landscape's real data is not on this machine (the bench skips that landscape)."""


SHARED_DATA = Path(os.environ.get("AUTOTUNE_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared_traces(name: str, *, sessions: int, max_context: int) -> Callable[[Path], Path]:
    """The first ``sessions`` sessions of the real Claude Code traces (Weka format, in
    $AUTOTUNE_SHARED_DATA or ../shared/data; never copied into the repo), requests over
    ``max_context`` tokens dropped: ``autotune workload import`` and ``slice``."""

    def write(directory: Path) -> Path:
        source = SHARED_DATA / "claude-code-traces"
        if not source.is_dir():
            raise MissingData(f"real traces {source} absent (set AUTOTUNE_SHARED_DATA)")
        workload, _ = import_workload("weka", source)
        sliced, _ = slice_workload(workload, sessions=sessions, max_context=max_context)
        path = directory / f"{name}.jsonl"
        write_workload(path, sliced.records())
        return path

    return write


def generated(name: str, make: Callable[[], Workload]) -> Callable[[Path], Path]:
    def write(directory: Path) -> Path:
        path = directory / f"{name}.jsonl"
        write_workload(path, make().records())
        return path

    return write


CHUNK_KNEE_TOKENS = 3000  # the chunked truth's knee: between the lattice's 2,048 and 4,096


def chunk_knee(config: TrialConfig) -> float:
    """Throughput past a batched-tokens knee falls as the square root of the excess (a
    prefill chunk that no longer fits the card's caches slows every mixed step): a shape
    the simulator's constants cannot take, with the optimum between the lattice's points."""
    tokens = int(config.flags.get("max-num-batched-tokens") or CHUNK_KNEE_TOKENS)
    return min(1.0, (CHUNK_KNEE_TOKENS / tokens) ** 0.5)


# The truth's throughput factor of a config, by name (``Landscape.structure``).
STRUCTURES: dict[str, Callable[[TrialConfig], float]] = {"chunk-knee": chunk_knee}
README_SLOS = ("ttft_p95<=20s",)  # the README quick start's
LANDSCAPES = {
    "readme": Landscape(
        "readme",
        "rtx4080s-32g",
        "qwen3.6-27b-awq",
        SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml",
        lambda _: REPO / "workloads" / "sample-claudecode.jsonl",
        LoadSpec(),
        slos=README_SLOS,
    ),
    "h100-chat": Landscape(
        "h100-chat",
        "h100-80g",
        "llama-3.1-8b",
        SEARCH_SPACES_DIR / "default.yaml",
        generated("chat", lambda: chat(ChatParams(requests=160, seed=1))),
        LoadSpec(mode="concurrency", concurrency=48),
    ),
    "longctx-24g": Landscape(
        "longctx-24g",
        "rtx4090-24g",
        "qwen3.6-27b-awq",
        SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml",
        generated(
            "cc-long", lambda: claudecode(ClaudeCodeParams(sessions=4, seed=1, max_context=60_000))
        ),
        LoadSpec(),
        shape_kv=True,
    ),
    # Held out: added after the tuner's constants were last chosen (docs/measurements/history.md,
    # "Common random numbers"), to check them on a GPU, traffic and truth they never saw.
    "l40s-cc": Landscape(
        "l40s-cc",
        "l40s-48g",
        "qwen3.6-27b-awq",
        SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml",
        generated(
            "cc-l40s",
            lambda: claudecode(
                ClaudeCodeParams(sessions=6, seed=7, max_context=80_000, requests_per_session=10)
            ),
        ),
        LoadSpec(),
        shape_kv=True,
    ),
    # Held out too: added with the tuner's constants frozen at 141d5b5, and run only to
    # check a change once it was chosen (docs/measurements/history.md, "The local search judged by
    # the knowledge gradient, and a second held-out landscape").
    "a100-agent": Landscape(
        "a100-agent",
        "a100-80g",
        "qwen3.6-27b-awq",
        SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml",
        generated(
            "agent-a100",
            lambda: chat(ChatParams(requests=200, seed=5, rate_rps=4.0, system_tokens=3000)),
        ),
        LoadSpec(mode="concurrency", concurrency=24),
        shape_kv=True,
    ),
    # The README's case where the simulator is wrong about the optimum: MTP's first draft
    # is accepted at the catalog's rate, its second and third at a tenth of it (Qwen3.6's
    # MTP head is one layer, chained on its own output for k > 1; on a 4-bit checkpoint the
    # chained drafts drift; the field notes: acceptance "swings widely with the task").
    # The simulator's whole top is MTP 2-3 with LMCache; the truth's optimum is MTP 1.
    "readme-misled": Landscape(
        "readme-misled",
        "rtx4080s-32g",
        "qwen3.6-27b-awq",
        SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml",
        lambda _: REPO / "workloads" / "sample-claudecode.jsonl",
        LoadSpec(),
        truth_of="readme",
        mtp_acceptance_factors=(1.0, 0.1, 0.1),
        adverse=False,
        slos=README_SLOS,
    ),
    # A truth that differs from the simulator in shape (``chunk_knee``), not only in its
    # constants: throughput falls past 3,000 batched tokens, between two lattice points.
    "readme-chunked": Landscape(
        "readme-chunked",
        "rtx4080s-32g",
        "qwen3.6-27b-awq",
        SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml",
        lambda _: REPO / "workloads" / "sample-claudecode.jsonl",
        LoadSpec(),
        truth_of="readme",
        adverse=False,
        slos=README_SLOS,
        structure="chunk-knee",
    ),
    # The memory edge: a 24 GB card, eight real Claude Code sessions up to 32k tokens, and
    # a truth wrong in the directions that matter there: compute slower, MTP accepted more
    # often, memory 4% dearer than the memory model. Its best config lies in a narrow band
    # of batched tokens just below where the truth runs out of memory, between the
    # lattice's points (docs/benchmarks.md, "The memory edge").
    "cc-traces-24g": Landscape(
        "cc-traces-24g",
        "rtx4090-24g",
        "qwen3.6-27b-awq",
        SEARCH_SPACES_DIR / "qwen3.6-27b-awq.yaml",
        shared_traces("cc-traces", sessions=8, max_context=32_000),
        LoadSpec(),
        shape_kv=True,
        adverse=False,
        shift=TruthShift(compute=0.75, acceptance=1.1, memory=1.04),
        chunk_sweep=True,
    ),
}


def truth_constants(landscape: str, adverse: bool) -> SpeedConstants:
    """The landscape's truth: every speed constant off by up to ~30%, seeded by its name;
    with a ``TruthShift``, the catalog's constants shifted in its directions alone."""
    shape = LANDSCAPES[landscape]
    model = get_model(shape.model)
    if shape.shift is not None:
        return shifted(DEFAULT_CONSTANTS, model.default_mtp_acceptance, shape.shift)
    rng = random.Random(f"truth:{shape.truth_of or landscape}")
    base = DEFAULT_CONSTANTS.model_dump()
    values: dict[str, Any] = {}
    for name, value in base.items():
        if isinstance(value, float):
            factor = math.exp(rng.uniform(-0.3, 0.3))
            values[name] = min(value * factor, 1.0) if "efficiency" in name else value * factor
    acceptance = [min(0.98, p * rng.uniform(0.85, 1.08)) for p in model.default_mtp_acceptance]
    factors = [*shape.mtp_acceptance_factors, *[1.0] * len(acceptance)]
    acceptance = [p * f for p, f in zip(acceptance, factors, strict=False)]
    if adverse:  # what the simulator likes most is worse than it thinks
        acceptance = [p * 0.6 for p in acceptance]
        values["draft_pass_overhead_s"] *= 2.5
        values["spec_per_seq_overhead_s"] *= 2.5
        values["per_seq_overhead_s"] *= 3.0
        values["piecewise_overhead_s"] *= 2.0
    values["mtp_acceptance"] = tuple(acceptance) or None
    return SpeedConstants(**values)


def shifted(
    constants: SpeedConstants, acceptance: tuple[float, ...], shift: TruthShift
) -> SpeedConstants:
    """``constants`` with compute slower and ``acceptance`` higher by ``shift``'s factors."""
    efficiency = {
        name: getattr(constants, name) * shift.compute
        for name in ("compute_efficiency", "prefill_compute_efficiency")
    }
    accepted = tuple(min(0.98, p * shift.acceptance) for p in acceptance) or None
    return constants.model_copy(update={**efficiency, "mtp_acceptance": accepted})


def truth_of(landscape: Landscape, spec: StudySpec, constants: SpeedConstants) -> SimOracle:
    """The simulator under the truth's constants, for the study ``prepare`` set up, with
    its own random draws: the tuner's simulator never meets the truth's acceptance draws."""
    calibration = CalibrationProfile(constants=constants, source="bench truth")
    return SimOracle(
        landscape.hardware,
        landscape.model,
        spec.plan,
        spec.load,
        spec.goal,
        calibration,
        seed=TRUTH_SEED,
    )


def truth_memory(landscape: str) -> MemoryPerturbation:
    """The harsh truth's memory: each of the memory model's constants off by a few percent
    (up to 8%, mostly more), seeded by the landscape's name; a ``TruthShift``'s own factor
    on each where the landscape has one."""
    shift = LANDSCAPES[landscape].shift
    if shift is not None:
        return MemoryPerturbation(
            activation=shift.memory,
            cudagraph=shift.memory,
            non_torch=shift.memory,
            per_seq=shift.memory,
        )
    rng = random.Random(f"memory:{LANDSCAPES[landscape].truth_of or landscape}")
    return MemoryPerturbation(
        **{
            name: 1.0 + rng.uniform(-0.03, 0.08)
            for name in ("activation", "cudagraph", "non_torch", "per_seq")
        }
    )


@dataclass
class Truth:
    """The truth's answers, cached per effective config. With ``memory``, the truth plans
    its memory with these factors and a config that does not fit there is an OOM launch
    (and infeasible), whatever the simulator's plan says."""

    oracle: SimOracle
    predictions: dict[str, Prediction] = field(default_factory=dict)
    values: dict[str, float | None] = field(default_factory=dict)  # noise-free, None: infeasible
    memory: MemoryPerturbation | None = None
    max_prompt_tokens: int = 0  # the workload's longest prompt: its prefill's transient
    structure: Callable[[TrialConfig], float] | None = None  # a shape the simulator lacks

    def oom(self, config: TrialConfig) -> Failure | None:
        """The truth's own OOM for ``config`` (at startup, or the load's largest prefill)."""
        if self.memory is None:
            return None
        argv = [self.oracle.sim_model, *config.vllm_args()[1:], "--hardware", self.oracle.hardware]
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                sim = parse_serve_args(argv).sim
        except SystemExit:
            return None
        report = plan_memory(sim, perturbation=self.memory)
        if not report.fits:
            text = report.failure_message or ""
            return Failure(
                failure_class=FailureClass(report.failure_class),
                message=text.splitlines()[0] if text else "",
                log_excerpt=text,
            )
        chunk = min(report.max_num_batched_tokens, self.max_prompt_tokens)
        transient = (
            report.transient_prefill_bytes_per_token * chunk + report.transient_bytes_per_seq
        )
        if report.headroom_bytes < transient:
            text = torch_oom_text(transient, get_gpu(self.oracle.hardware), report.headroom_bytes)
            return Failure(failure_class=FailureClass.CUDA_OOM_LOAD, message=text, log_excerpt=text)
        return None

    def prediction(self, config: TrialConfig) -> Prediction:
        key = config_key(config)
        if key not in self.predictions:
            prediction = self.oracle.predict(config)
            assert prediction is not None, config
            self.predictions[key] = prediction.model_copy(
                update={"records": prediction.records[:1]}
            )
        return self.predictions[key]

    def value(self, config: TrialConfig) -> float | None:
        if self.oom(config) is not None:
            return None
        key = config_key(config)
        if key not in self.values:
            scored = self.oracle.score(config)
            self.values[key] = scored.values[0] if scored and scored.feasible else None
            if self.values[key] is not None:
                self.values[key] *= self.shape(config)  # type: ignore[operator]
        return self.values[key]

    def shape(self, config: TrialConfig) -> float:
        """The structural factor on ``config``'s throughput (1.0 without a structure)."""
        return 1.0 if self.structure is None else self.structure(config)


@dataclass
class StudyLog:
    """One study's launches as the bench saw them."""

    launches: int = 0
    oom_launches: int = 0
    seconds: list[float] = field(default_factory=list)  # modelled GPU seconds per launch
    handed_over: list[float] = field(default_factory=list)  # true tok/s handed over per launch
    launched_best: float = 0.0  # the best true value of any config this study launched
    last_launched: bool = False
    measured: dict[str, int] = field(default_factory=dict)  # config key -> measurements so far
    pruned: int = 0  # launches stopped early
    winners_pruned: int = 0  # ... whose config is within 1% of the optimum
    improvers_pruned: int = 0  # ... whose config beats what the tool would hand over then
    launched: list[str] = field(default_factory=list)  # each launch's config (a short digest)
    launched_true: list[float] = field(default_factory=list)  # each launch's true tok/s
    launched_seen: list[float] = field(default_factory=list)  # ... and what it measured (0: failed)
    flags: dict[str, dict] = field(default_factory=dict)  # config digest -> its launch flags


def in_process_measure(
    truth: Truth, log: StudyLog, label: str, seed: int, optimum: float, *, harsh: bool = False
) -> Callable:
    """The study's measure hook: the pre-screen, then the truth's prediction with noise;
    the prediction's progress goes to ``on_progress`` (the pruner) as the replay's would.
    Gentle: throughput alone is noised. Harsh: every figure, heavy-tailed, with drift."""

    def measure(
        spec: StudySpec,
        config: TrialConfig,
        log_path: Path,
        on_progress: Callable[[Progress], bool] | None = None,
    ) -> TrialResult:
        result = TrialResult(config=config)
        result.memory = spec.prescreen(config) if spec.prescreen is not None else None
        log.last_launched = False
        if spec.skip_predicted_oom and result.memory is not None and not result.memory.fits:
            result.outcome_override = Outcome.PREDICTED_OOM.value
            return result
        prediction = truth.prediction(config)
        if (failure := truth.oom(config)) is not None:
            prediction = prediction.model_copy(update={"failure": failure})
        log.launches += 1
        log.launched.append(digest_of(config_key(config)))
        log.flags.setdefault(log.launched[-1], dict(config.flags))
        log.launched_best = max(log.launched_best, truth.value(config) or 0.0)
        log.launched_true.append(truth.value(config) or 0.0)
        log.launched_seen.append(0.0)
        log.last_launched = True
        argv = [
            truth.oracle.sim_model,
            *config.vllm_args()[1:],
            "--hardware",
            truth.oracle.hardware,
        ]
        startup_s = startup_phases(parse_serve_args(argv), prediction.memory).total_s
        result.argv = argv
        result.startup = prediction.startup
        result.failure = prediction.failure
        result.server_stats = prediction.server_stats
        if prediction.failure is not None:
            log.oom_launches += int(prediction.failure.failure_class.is_oom)
            log.seconds.append(startup_s)
            return result
        key = config_key(config)
        k = log.measured.get(key, 0)
        log.measured[key] = k + 1

        def draw(figure: str) -> float:
            return noise_factor(label, seed, key, k, figure=figure, harsh=harsh)

        shape = truth.shape(config)
        stats = noised_stats(prediction.stats, lambda _: 1.0, 1.0 - shape)
        drift = DRIFT_PER_LAUNCH * (log.launches - 1) if harsh else 0.0
        factor = draw("throughput" if harsh else "") * (1.0 - drift)
        if harsh:
            result.stats = noised_stats(stats, draw, drift)
            result.server_stats = noised_server_stats(prediction.server_stats, draw)
        else:
            result.stats = stats.model_copy(
                update={
                    "output_throughput_tok_s": stats.output_throughput_tok_s * factor,
                    "total_token_throughput_tok_s": stats.total_token_throughput_tok_s * factor,
                    "request_throughput_rps": stats.request_throughput_rps * factor,
                }
            )
        replay_s = stats.duration_s
        for point in prediction.progress if on_progress is not None else ():
            seen = replace(point, output_tok_s=point.output_tok_s * factor * shape)
            if on_progress(seen):  # type: ignore[misc]  # not None in this loop
                result.stats = result.stats.model_copy(
                    update={
                        "output_throughput_tok_s": seen.output_tok_s,
                        "stopped_early": f"pruned at {point.step}% of the replay",
                    }
                )
                replay_s = point.at_s
                _count_prune(log, truth.value(config), optimum)
                break
        log.seconds.append(startup_s + replay_s)
        log.launched_seen[-1] = result.stats.output_throughput_tok_s
        return result

    return measure


def _count_prune(log: StudyLog, value: float | None, optimum: float) -> None:
    log.pruned += 1
    log.winners_pruned += int((value or 0.0) >= 0.99 * optimum)
    log.improvers_pruned += int((value or 0.0) > (log.handed_over[-1] if log.handed_over else 0.0))


class BenchObserver:
    """Records the handed-over config after each launch; stops the search at its budget."""

    def __init__(self, log: StudyLog, truth: Truth, budget: int):
        self.log, self.truth, self.budget = log, truth, budget
        self.configs: dict[int, TrialConfig] = {}

    def on_trial_start(self, number: int, params: dict, flags: dict, is_baseline: bool) -> None:
        pass

    def on_phase(self, phase: str) -> None:
        pass

    def on_request_done(self, record: Any, done: int, total: int | None) -> None:
        pass

    def on_trial_end(self, trial: Any, outcome: str, study: optuna.Study) -> None:
        if self.log.last_launched:
            self.log.last_launched = False
            winner = handed_over(study)
            value = self.truth.value(winner) if winner is not None else None
            self.log.handed_over.append(value or 0.0)
        if self.log.launches >= self.budget:
            study.stop()


def handed_over(study: optuna.Study) -> TrialConfig | None:
    """The config the tool would hand over now (the tuner's crown, as ``autotune run``'s)."""
    entry = study.sampler.scheduler.crowned()  # type: ignore[attr-defined]
    if entry is None:
        return None
    trial = study.trials[entry.first_trial]
    return TrialConfig.model_validate(trial.user_attrs["config"])


class AutoTuneWalk(optuna.samplers.BaseSampler):
    """vLLM's auto_tune.sh: for each max-num-seqs, each max-num-batched-tokens, the memory
    knob from its top down until a server starts; everything else at the baseline."""

    def __init__(self, space: SearchSpace) -> None:
        dists = space.distributions()
        base = space.baseline_params()
        memory = next(n for n in dists if "memory" in n)
        self.points: list[dict] = []
        for seqs in ladder(dists["max_num_seqs"]):
            for tokens in ladder(dists["max_num_batched_tokens"]):
                pair = []
                for kv in sorted(ladder(dists[memory]), reverse=True):
                    pair.append(
                        {**base, "max_num_seqs": seqs, "max_num_batched_tokens": tokens, memory: kv}
                    )
                self.points.append(pair)  # type: ignore[arg-type]
        self.dists = dists
        self._queue: list[dict] = []
        self._pair = -1

    def infer_relative_search_space(self, study, trial):
        return dict(self.dists)

    def sample_relative(self, study, trial, search_space):
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if done and done[-1].user_attrs.get("measured"):
            self._queue = []  # this pair started: on to the next one
        if not self._queue:
            self._pair += 1
            if self._pair >= len(self.points):
                return {}
            self._queue = list(self.points[self._pair])  # type: ignore[arg-type]
        return self._queue.pop(0)

    def sample_independent(self, study, trial, name, dist):
        return optuna.samplers.RandomSampler().sample_independent(study, trial, name, dist)


GP_COST = (
    "Optuna's GPSampler spends 3-5 s a trial optimising its acquisition over this mixed "
    "space on 2 cores (about 2 min a study, 85% of it in its discrete local search), "
    "more than --quick's 10 minutes for its 10 studies alone"
)
# strategy -> (sampler, tuner settings)
PLAIN = TunerSettings(warm_start=0, learn=False, confirm=0, dedup=False, prune=False)
DEFAULT = TunerSettings()
STRATEGIES: dict[str, tuple[str, TunerSettings]] = {
    "grid (auto_tune walk)": ("grid-walk", PLAIN),
    "random": ("random", PLAIN),
    "tpe": ("tpe", PLAIN),
    "gp": ("gp", PLAIN),
    "default": ("guided", DEFAULT),
    "default, no warm start": ("guided", TunerSettings(warm_start=0)),
    "default, no learning": ("guided", TunerSettings(learn=False)),
    "default, no confirmation": ("guided", TunerSettings(confirm=0)),
    "default, no racing (duel)": ("guided", DEFAULT.replaced(race=False, race_early=False)),
    "default, no early racing": ("guided", DEFAULT.replaced(race_early=False)),
    "default, crown prior": ("guided", DEFAULT.replaced(crown_prior=True)),
    "default, no exploring tail": ("guided", DEFAULT.replaced(explore_tail=False)),
    "default, no dedup": ("guided", DEFAULT.replaced(dedup=False)),
    "default, no back-off after OOM": ("guided", DEFAULT.replaced(backoff=False)),
    "default, recheck": ("guided", DEFAULT.replaced(recheck=True)),
    # pruning is on or off by default (docs/measurements/history.md); the other way round:
    f"default, {'no pruning' if DEFAULT.prune else 'pruning'}": (
        "guided",
        DEFAULT.replaced(prune=not DEFAULT.prune),
    ),
    f"default, {'no refinement' if DEFAULT.refine else 'refinement'}": (
        "guided",
        DEFAULT.replaced(refine=not DEFAULT.refine),
    ),
    "default, no recalibration": ("guided", DEFAULT.replaced(recalibrate=False)),
    "default, no speed recalibration": ("guided", DEFAULT.replaced(recalibrate_speed=False)),
    "default, no local search": ("guided", DEFAULT.replaced(local_search=0)),
    "default, no overtaking": ("guided", DEFAULT.replaced(overtake=False)),
    "default, re-seed after recalibration": ("guided", DEFAULT.replaced(reseed=True)),
    "default, no simulator (tpe)": ("tpe", DEFAULT),
}
STRATEGIES.update(  # the local search's budget, against the default's
    {
        f"default, local search {n}": ("guided", DEFAULT.replaced(local_search=n))
        for n in (2, 8, 12)
        if n != DEFAULT.local_search
    }
)
QUICK = ["grid (auto_tune walk)", "random", "tpe", "default"]


def warm_started(setup: dict, settings: TunerSettings) -> dict:
    """The tuner's prediction cache as `autotune run`'s warm start leaves it on a first
    night: the replays of the two tiers' short list and climb (``tuner/two_tier.py``:
    counted, not timed, so the same configs on any machine; found once per setup by
    running it), taken from the lattice's replays; off-lattice entries (refinement's,
    predicted on demand in a study too) are kept. An empty cache (nothing predicted
    ahead) is the study's to fill, in real time, as in `autotune run`."""
    cache: dict = setup["cache"]
    if not cache:
        return cache
    candidates: list[Candidate] = setup["candidates"]
    memo = ("two tiers", settings.warm_start_configs)
    if memo not in setup:
        spec: StudySpec = setup["spec"]
        assert spec.oracle is not None
        replays: dict = {}
        maximize = spec.goal.directions[0] == "maximize"
        predict_two_tier(
            spec.oracle,
            candidates,
            replays,
            maximize=maximize,
            shortlist_configs=settings.warm_start_configs,
        )
        setup[memo] = set(replays)
    kept = setup[memo]
    lattice = {c.key for c in candidates}
    return {key: value for key, value in cache.items() if key in kept or key not in lattice}


def warm_share(setup: dict) -> str:
    """How many lattice configs the default's warm start replays, as ``warm_started``."""
    held = warm_started(setup, STRATEGIES["default"][1])
    lattice = setup["candidates"]
    count = sum(c.key in held for c in lattice)
    return f"{count:,} of {len(lattice):,} replayed, the rest screened"


def run_one(
    label: str,
    setup: dict,
    truth: Truth,
    optimum: float,
    strategy: str,
    seed: int,
    budget: int,
    harsh: bool = False,
) -> StudyLog:
    sampler_name, settings = STRATEGIES[strategy]
    log = StudyLog()
    base: StudySpec = setup["spec"]
    n_trials = budget if settings.confirm else MAX_TRIALS
    cache = warm_started(setup, settings)  # the study's own warm start screens the rest
    with tempfile.TemporaryDirectory() as tmp:
        spec = replace(
            base,
            name="bench",
            # With confirmation the budget is --trials, as `autotune run --trials N` spends
            # it (re-measurements are its last trials); without, the study runs to N launches
            # (plain samplers skip many predicted OOMs, which launch nothing).
            n_trials=n_trials,
            sampler=AutoTuneWalk(base.space) if sampler_name == "grid-walk" else sampler_name,
            seed=sampler_seed(sampler_name, seed),
            artifacts_dir=Path(tmp) / "artifacts",
            runs_dir=Path(tmp) / "runs",
            heartbeat_interval_s=0,
            tuner=settings,
            prediction_cache=cache,
            measure=in_process_measure(truth, log, label, seed, optimum, harsh=harsh),
        )
        run_study(spec, observer=BenchObserver(log, truth, budget))
    return log


_JOB: tuple = ()  # run_one's arguments but the seed, for the forked workers of ``studies``


def _run_seed(seed: int) -> StudyLog:
    label, setup, truth, optimum, strategy, budget, harsh = _JOB
    return run_one(label, setup, truth, optimum, strategy, seed, budget, harsh)


def studies(job: tuple, seeds: range, jobs: int) -> Iterator[StudyLog]:
    """One strategy's studies at ``seeds`` (in order), ``jobs`` at a time in forked
    processes: each inherits the landscape's predictions, and what it predicts besides
    (off-lattice configs) stays in it. Every study is seeded, so the logs are the ones a
    serial run gives."""
    global _JOB
    _JOB = job
    if jobs < 2 or len(seeds) < 2:
        yield from map(_run_seed, seeds)
        return
    # Not multiprocessing.Pool: its workers are daemons, which may not start the
    # recalibration's own prediction workers.
    fork = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(min(jobs, len(seeds)), mp_context=fork) as pool:
        yield from pool.map(_run_seed, seeds)


def first_reaching(curve: list[float], level: float) -> int | None:
    return next((i + 1 for i, value in enumerate(curve) if value >= level - 1e-9), None)


def settled_at(curve: list[float], level: float) -> int | None:
    """The launch from which the handed-over config stays at ``level`` to the end."""
    if not curve or curve[-1] < level - 1e-9:
        return None
    start = len(curve)
    while start > 0 and curve[start - 1] >= level - 1e-9:
        start -= 1
    return start + 1


def shared_launches(logs: list[StudyLog]) -> int:
    """How many first launches are the same config in every study: how far the seeds are
    independent (the default's baseline and warm-start seeds come from the predictions
    alone, so they are one plan under independent noise)."""
    if len(logs) < 2:
        return 0
    shared = 0
    for launches in zip(*(log.launched for log in logs), strict=False):
        if len(set(launches)) > 1:
            break
        shared += 1
    return shared


def oracle_crown(log: StudyLog, *, harsh: bool) -> float:
    """The true value of the config an oracle crown hands over from this study's own
    measurements: one that knows the bench's noise (``noise_factor``'s spread and tails,
    its rare outliers aside) and drift (``DRIFT_PER_LAUNCH``) exactly, and which launched
    configs are feasible in truth, and crowns the best location the noise's likelihood
    gives each config (log scale, on a grid). Not a bound (one lucky run still lifts a
    config measured once), but a crown rule that falls short of it on the same launches
    misreads the noise or the drift; one level with it loses its misses to which configs
    got the runs. 0.0 when nothing feasible ran."""
    runs: dict[str, list[float]] = {}
    true: dict[str, float] = {}
    for i, (digest, value, seen) in enumerate(
        zip(log.launched, log.launched_true, log.launched_seen, strict=True)
    ):
        if seen > 0 and value > 0:
            drift = DRIFT_PER_LAUNCH * i if harsh else 0.0
            runs.setdefault(digest, []).append(math.log(seen / (1.0 - drift)))
            true[digest] = value
    if not runs:
        return 0.0
    return true[max(runs, key=lambda digest: likeliest_location(runs[digest], harsh=harsh))]


_OFFSETS = np.linspace(-0.3, 0.3, 1201)  # ``likeliest_location``'s grid about the median


def likeliest_location(found: list[float], *, harsh: bool) -> float:
    """The location (log scale) the bench's noise law finds likeliest for these runs (logs
    of measured over true): the mean under the gentle bench's normal noise; under the
    harsh one's Student-t tails (its rare outliers aside) the best point of a grid."""
    if not harsh:
        return statistics.fmean(found)
    scale = NOISE * math.sqrt((TAIL_DOF - 2) / TAIL_DOF)
    grid = statistics.median(found) + _OFFSETS
    residuals = (np.array(found)[:, None] - grid[None, :]) / scale
    # Student-t's log density up to a constant: -(dof + 1) / 2 * log(1 + r^2 / dof)
    fit = -np.log1p(residuals**2 / TAIL_DOF).sum(axis=0)
    return float(grid[int(np.argmax(fit))])


def known_values(setup: dict, truth: Truth, logs: list[StudyLog]) -> list[float]:
    """The true values of every config the bench knows feasible in truth: the lattice's,
    the chunk sweep's and any config a study launched, each once."""
    values = {
        digest_of(c.key): value
        for c in setup["candidates"]
        if (value := truth.value(c.config)) is not None
    }
    lattice = {c.key for c in setup["candidates"]}
    for key, value in truth.values.items():  # off the lattice: valued only when they fit
        if key not in lattice and value is not None:
            values.setdefault(digest_of(key), value)
    for log in logs:
        for digest, value in zip(log.launched, log.launched_true, strict=True):
            if value > 0:
                values.setdefault(digest, value)
    return list(values.values())


PLATEAU = 0.02  # ``handed_plateau``: the configs this close to the best known
PLATEAU_NIGHTS = 1600  # ... the nights each allocation plays (at 400, l40s-cc read 7 points high)


def plateau_schedules(budget: int) -> list[tuple[int, ...]]:
    """The allocations ``handed_plateau`` tries, as how many configs each round keeps: the
    first round measures each once; ``(m, h)`` races the ``h`` best of ``m`` over the rest
    of the launches; ``(m, m/2, m/4, ...)`` halves them, each cut's round an equal share."""
    races = [(m, h) for m in (2, 4, 6, 8, 10, 14, 18) for h in range(1, min(4, m) + 1)]
    halvings = []
    for m in (4, 6, 8, 12, 16):
        kept = [m]
        while kept[-1] // 2 >= 2:
            kept.append(kept[-1] // 2)
        halvings.append(tuple(kept))
    return [s for s in races + halvings if s[0] < budget]


def plateau_night(
    pool: list[float], schedule: tuple[int, ...], budget: int, night: int, *, harsh: bool
) -> float:
    """One night of ``handed_plateau``'s allocation ``schedule`` over ``pool`` (true values,
    shares of the best known): the crowned config's share."""
    runs: dict[int, list[float]] = {}

    def measure(index: int, times: int) -> None:
        found = runs.setdefault(index, [])
        for _ in range(times):
            noise = noise_factor("plateau", night, str(index), len(found), harsh=harsh)
            found.append(math.log(pool[index] * noise))

    alive = random.Random(f"plateau:{night}").sample(range(len(pool)), min(schedule[0], len(pool)))
    for index in alive:
        measure(index, 1)
    left = budget - len(alive)
    for cut, kept in enumerate(schedule[1:], start=1):
        ranked = sorted(alive, key=lambda i: likeliest_location(runs[i], harsh=harsh))
        alive = ranked[-kept:]
        share = left // (len(schedule) - cut) // len(alive)
        for index in alive:
            measure(index, share)
        left -= share * len(alive)
    return pool[max(alive, key=lambda i: likeliest_location(runs[i], harsh=harsh))]


def handed_plateau(
    values: list[float], best: float, launches: int, *, harsh: bool, nights: int = PLATEAU_NIGHTS
) -> dict:
    """A yardstick for a row's within-1% rate: an allocator handed what no tuner knows, the
    configs truly within ``PLATEAU`` of the best known (``values``, true tok/s; not their
    order), and the bench's noise law, with the night's launches but the baseline. It
    measures some once, races or halves the best of them over the rest of its launches
    (``plateau_schedules``), and crowns the likeliest location; each allocation plays
    ``nights`` nights on paired noise draws (``noise_factor``; the drift, known to it,
    left out), and the best allocation's rate is the yardstick (it reads a little high at
    few nights: the best of many rates). Where it is short of 9 in 10, telling the
    plateau's configs apart within 1% takes more launches than the night has. Not a bound:
    an allocator could do better still, and a tuner's simulator may rank inside the
    plateau."""
    pool = sorted((v / best for v in values if v >= (1.0 - PLATEAU) * best), reverse=True)
    budget = launches - 1
    rates = {
        schedule: statistics.fmean(
            plateau_night(pool, schedule, budget, night, harsh=harsh) >= 0.99
            for night in range(nights)
        )
        for schedule in plateau_schedules(budget)
    }
    schedule, rate = max(rates.items(), key=lambda item: item[1])
    return {
        "configs": len(pool),
        "within_1pct": sum(v >= 0.99 for v in pool),
        "rate": rate,
        "allocation": list(schedule),
    }


def summarize(logs: list[StudyLog], budget: int, optimum: float, *, harsh: bool) -> dict:
    """The figures of one strategy's studies, against ``optimum`` (true tok/s)."""
    curves = [[value / optimum for value in log.handed_over] for log in logs]

    def launches(level: float) -> list[int | None]:
        return [first_reaching(curve, level) for curve in curves]

    def med(values: list[int | None]) -> float | None:
        filled = [v if v is not None else budget + 1 for v in values]
        result = statistics.median(filled)
        return None if result > budget else result

    def worst(values: list[int | None]) -> int | None:
        return None if any(v is None for v in values) else max(values)  # type: ignore[type-var]

    to99, to95 = launches(0.99), launches(0.95)
    stays99 = [settled_at(curve, 0.99) for curve in curves]
    hours = [
        sum(log.seconds[:n]) / 3600 if n is not None else None
        for log, n in zip(logs, to99, strict=True)
    ]
    finals = [curve[-1] if curve else 0.0 for curve in curves]
    known_hours = [h for h in hours if h is not None]
    within = sum(f >= 0.99 for f in finals)
    # Studies that launched a config within 1% at least once: what a crown that knew the
    # launched configs' true values would reach. The gap to ``within`` is the crown's under
    # the noise; the studies short of it are the search's.
    reached = sum(log.launched_best >= 0.99 * optimum for log in logs)
    oracle = sum(oracle_crown(log, harsh=harsh) >= 0.99 * optimum for log in logs)
    interval = binomtest(within, len(finals)).proportion_ci(method="wilson")
    return {
        "median_launches_to_99": med(to99),
        "worst_launches_to_99": worst(to99),
        "median_launches_to_stay_99": med(stays99),
        "worst_launches_to_stay_99": worst(stays99),
        "launches_per_study": statistics.fmean(log.launches for log in logs),
        "same_first_launches": shared_launches(logs),
        "median_launches_to_95": med(to95),
        "worst_launches_to_95": worst(to95),
        "oom_launches_per_study": statistics.fmean(log.oom_launches for log in logs),
        "median_gpu_hours_to_99": statistics.median(known_hours)
        if len(known_hours) * 2 > len(logs)
        else None,
        "winner_median": statistics.median(finals),
        "winner_worst": min(finals),
        "winner_within_1pct_rate": within / len(finals),
        "winners_within_1pct": within,
        "launched_within_1pct": reached,
        "oracle_crown_within_1pct": oracle,
        # Wilson 95% interval of the rate: where two strategies' intervals overlap widely,
        # their difference in these seeds may be noise.
        "winner_within_1pct_interval": [round(bound, 3) for bound in interval],
        "gpu_hours_per_study": statistics.fmean(sum(log.seconds) for log in logs) / 3600,
        "pruned_per_study": statistics.fmean(log.pruned for log in logs),
        "winners_pruned_per_study": statistics.fmean(log.winners_pruned for log in logs),
        "improvers_pruned_per_study": statistics.fmean(log.improvers_pruned for log in logs),
        "seeds": len(logs),
    }


def prepare(landscape: Landscape, directory: Path, *, harsh: bool = False) -> dict:
    """What `autotune run` would set up for this landscape (``prepare_study``: pre-flight,
    max-model-len sized from the workload, pre-screen, the tuner's simulator)."""
    options = RunOptions(
        workload=landscape.workload(directory),
        engine="sim",
        model=landscape.model,
        hardware=landscape.hardware,
        space=landscape.space,
        storage="sqlite:///:memory:",
        load=landscape.load,
        slos=list(landscape.slos) if harsh else [],
    )
    spec = prepare_study(options)
    if landscape.shape_kv and spec.prescreen is not None:
        largest = largest_kv_pool_bytes(
            spec.space, model=spec.model, engine_version=None, prescreen=spec.prescreen
        )
        if largest is not None:
            spec = replace(spec, space=shaped(spec.space, largest))
    return {"spec": spec, "cache": {}}


def setup_key(setup: dict) -> str:
    """What a ``prepare``d study's predictions depend on (its cache's key)."""
    spec: StudySpec = setup["spec"]
    return digest_of(spec.space.digest(), spec.plan, spec.load, spec.goal, spec.model)


def label_of(name: str, *, adverse: bool, harsh: bool) -> str:
    """How the table and ``--raw`` name a landscape's truth under one bench."""
    return f"{name}{' (adverse)' if adverse else ''}{' [harsh]' if harsh else ''}"


def parse_label(label: str) -> tuple[str, bool, bool]:
    """``label_of``'s landscape, adverse and harsh, read back."""
    return label.split(" ")[0], "(adverse)" in label, "[harsh]" in label


def truth_for(
    name: str, setup: dict, cache: dict, *, adverse: bool, harsh: bool
) -> tuple[str, Truth]:
    """The label and the truth of landscape ``name`` for the study ``prepare`` set up, its
    answers kept in ``cache`` (``--cache``)."""
    landscape, spec = LANDSCAPES[name], setup["spec"]
    constants = truth_constants(name, adverse)
    label = label_of(name, adverse=adverse, harsh=harsh)
    truth_key = f"{label}:{setup_key(setup)}:{digest_of(constants.model_dump_json())}"
    return label, Truth(
        truth_of(landscape, spec, constants),
        predictions=cache.setdefault(f"{truth_key}:predictions", {}),
        values=cache.setdefault(f"{truth_key}:values", {}),
        memory=truth_memory(name) if harsh else None,
        max_prompt_tokens=max((r.prompt_tokens for r in spec.plan.requests), default=0),
        structure=STRUCTURES[landscape.structure] if landscape.structure else None,
    )


def exhaustive(setup: dict, landscape: Landscape, truth: Truth) -> tuple[float, int, float]:
    """The truth's optimum over the lattice (configs that pass the pre-screen), and timing;
    the lattice's configs go to ``setup["candidates"]``."""
    from autotune.tuner.lattice import enumerate_effective

    started = time.monotonic()
    spec: StudySpec = setup["spec"]
    version = spec.engine.version()  # the study's: its gates decide the flags launched
    key = (spec.space.digest(), spec.model, version, id(spec.prescreen))
    if key not in _ENUMERATIONS:  # the guide's memo: the studies do not enumerate again
        _ENUMERATIONS[key] = [
            c
            for c in enumerate_effective(
                spec.space, model=spec.model, engine_version=version, prescreen=spec.prescreen
            )
            if c.memory is None or c.memory.fits
        ]
    candidates = setup["candidates"] = _ENUMERATIONS[key]
    missing = [c for c in candidates if c.key not in truth.values]
    scores = predict_all(truth.oracle, [c.config for c in missing])
    for candidate, scored in zip(missing, scores, strict=True):
        feasible = scored is not None and scored.feasible
        value = scored.values[0] * truth.shape(candidate.config) if feasible else None
        truth.values[candidate.key] = value
    values = [v for c in candidates if (v := truth.value(c.config)) is not None]
    return max(values), len(candidates), time.monotonic() - started


CHUNK_SWEEP_TOKENS = 64  # the chunk sweep's step (``chunk_sweep``)


@dataclass
class ChunkSweep:
    """The truth's best config off the lattice along the prefill chunk, and its band."""

    best: float  # true tok/s
    params: dict[str, Any]
    band: tuple[int, int]  # the chunk's values within 1% of ``best`` along its row
    oom_from: int | None  # the smallest chunk of its row the truth runs out of memory at
    lattice_points: list[int]  # the chunk values the lattice holds in its row (edges too)

    def describe(self, lattice_optimum: float) -> str:
        row = {k: v for k, v in self.params.items() if k != "max_num_batched_tokens"}
        return (
            f"  chunk sweep: best {self.best:,.2f} tok/s ({self.best / lattice_optimum:.3f}x the "
            f"lattice's optimum) at {self.params['max_num_batched_tokens']:,} batched tokens; "
            f"within 1% of it {self.band[0]:,}-{self.band[1]:,}; the truth runs out of memory "
            f"from {self.oom_from or '-'}; the lattice's points in its row "
            f"{', '.join(f'{t:,}' for t in self.lattice_points)}\n    its row {row}"
        )


def chunk_sweep(setup: dict, truth: Truth) -> ChunkSweep | None:
    """The truth over every lattice row's prefill chunk (max-num-batched-tokens), every
    ``CHUNK_SWEEP_TOKENS`` from its low bound up to where the memory pre-screen stops
    passing: where the best config lies between the lattice's points, how narrow its band
    is and how near the truth's OOM edge. None when the space does not search the chunk."""
    spec: StudySpec = setup["spec"]
    version = spec.engine.version()
    name = "max_num_batched_tokens"
    dist = spec.space.distributions(version).get(name)
    if dist is None:
        return None
    rows: dict[str, tuple[dict[str, Any], list[int]]] = {}
    for c in setup["candidates"]:
        row = {k: v for k, v in c.params.items() if k != name}
        rows.setdefault(repr(sorted(row.items())), (row, []))[1].append(c.params[name])
    best: tuple[float, dict[str, Any], list[int], list[tuple[int, float | None, bool]]] | None
    best = None
    for row, points in rows.values():
        swept: list[tuple[int, float | None, bool]] = []  # tokens, true value, truth OOMs
        for tokens in range(dist.low, dist.high + 1, CHUNK_SWEEP_TOKENS):
            params = {**row, name: tokens}
            if spec.space.rule_violations(params):
                continue
            config = derive_config(
                spec.space,
                params,
                model=spec.model,
                engine_version=version,
                prescreen=spec.prescreen,
            )
            memory = spec.prescreen(config) if spec.prescreen is not None else None
            if memory is not None and not memory.fits:
                break
            swept.append((tokens, truth.value(config), truth.oom(config) is not None))
        for tokens, value, _ in swept:
            if value is not None and (best is None or value > best[0]):
                best = (value, {**row, name: tokens}, sorted(points), swept)
    if best is None:
        return None
    value, params, points, swept = best
    within = [t for t, v, _ in swept if v is not None and v >= 0.99 * value]
    oom = [t for t, _, out in swept if out]
    return ChunkSweep(value, params, (min(within), max(within)), min(oom, default=None), points)


def fill_tuner(setup: dict, timings: dict, key: str) -> None:
    """Predict the whole lattice into the tuner's cache, as the warm start of a study with
    no budget would, and time it (``timings[key]``, seconds): on this machine's cores and
    default workers, cold, as `autotune run` does on a first night. A cache filled before
    without a timing is predicted again for it."""
    spec: StudySpec = setup["spec"]
    assert spec.oracle is not None
    candidates = setup["candidates"]  # ``exhaustive``'s
    cache = setup["cache"]
    missing = [c for c in candidates if c.key not in cache]
    if missing or key not in timings:
        started = time.monotonic()
        scores = predict_all(spec.oracle, [c.config for c in candidates])
        timings[key] = time.monotonic() - started
        for candidate, scored in zip(candidates, scores, strict=True):
            cache.setdefault(candidate.key, scored)
    setup["warm_start_s"] = timings[key]


def misled_by(setup: dict, truth: Truth) -> dict:
    """How wrong the tuner's simulator is about the truth's optimum over the lattice: the
    optimum's rank in the tuner's own prediction (1 + the configs predicted better), the
    distance from the predicted optimum to it (the guide's coordinates: a categorical
    change is 1, a numeric parameter its range's fraction), and the true value of the
    predicted optimum against the truth's. Reads the tuner's predictions (``fill_tuner``)."""
    spec: StudySpec = setup["spec"]
    version = spec.engine.version()
    candidates, cache = setup["candidates"], setup["cache"]

    def predicted(c: Candidate) -> float:
        scored = cache[c.key]
        return scored.values[0] if scored is not None and scored.feasible else -math.inf

    def true(c: Candidate) -> float:
        value = truth.value(c.config)
        return -math.inf if value is None else value

    best = max(candidates, key=true)
    top = max(candidates, key=predicted)
    encode = make_encoder(spec.space, version)
    baseline = derive_config(
        spec.space,
        spec.space.baseline_params(),
        model=spec.model,
        engine_version=version,
        prescreen=spec.prescreen,
    )
    return {
        "truth_optimum_predicted_rank": 1 + sum(predicted(c) > predicted(best) for c in candidates),
        "predicted_to_true_distance": round(
            float(np.linalg.norm(encode(top.params) - encode(best.params))), 2
        ),
        "predicted_optimum_true_share": round(true(top) / true(best), 3),
        "baseline_true_share": round((truth.value(baseline) or 0.0) / true(best), 3),
        "truth_optimum": best.params,
        "predicted_optimum": top.params,
    }


def code_digest() -> str:
    """The simulator's code: a ``--cache`` made by another simulator is not used."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "autotune" / "sim").rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def digest_of(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def load_cache(path: Path | None) -> dict:
    if path is None or not path.exists():
        return {}
    cache = pickle.loads(path.read_bytes())
    return cache if cache.get("code") == code_digest() else {}


def study_record(
    label: str,
    strategy: str,
    seed: int,
    lattice_optimum: float,
    log: StudyLog,
    *,
    variant: str | None = None,
    swept_optimum: float = 0.0,
):
    """One study as ``--raw`` stores it (``--table`` re-reads it). A ``variant`` (a
    changed copy of the code) is named in its strategy, so ``--table`` sets the two apart;
    ``swept_optimum``: the chunk sweep's best (``chunk_sweep``), 0 where none was swept."""
    return {
        "landscape": label,
        "strategy": f"{strategy} [{variant}]" if variant else strategy,
        "seed": seed,
        "lattice_optimum": lattice_optimum,
        "swept_optimum": swept_optimum,
        **asdict(log),
    }


def read_raw(paths: list[Path]) -> tuple[list[dict], dict[str, float]]:
    """The studies of these ``--raw`` files, and per landscape the best known config's
    true value: the lattice's optimum, the chunk sweep's, or any config launched."""
    records = [json.loads(line) for path in paths for line in path.read_text().splitlines()]
    optimum: dict[str, float] = {}
    for record in records:
        best = max(
            record["lattice_optimum"], record.get("swept_optimum", 0.0), record["launched_best"]
        )
        optimum[record["landscape"]] = max(optimum.get(record["landscape"], 0.0), best)
    return records, optimum


def logged(record: dict) -> StudyLog:
    """The study log a ``--raw`` record keeps."""
    fields = set(StudyLog.__dataclass_fields__)
    return StudyLog(**{k: v for k, v in record.items() if k in fields})


def table_plateaus(paths: list[Path], budget: int, cache: dict) -> dict[str, dict]:
    """Per truth of these ``--raw`` files, ``handed_plateau`` against its best known, the
    configs its studies launched among the plateau's (each truth prepared again; ``cache``
    keeps its answers). A truth whose data is absent maps to why."""
    records, optimum = read_raw(paths)
    logs: dict[str, list[StudyLog]] = {}
    for record in records:
        logs.setdefault(record["landscape"], []).append(logged(record))
    plateaus: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as workloads:
        for label, found in logs.items():
            name, adverse, harsh = parse_label(label)
            landscape = LANDSCAPES[name]
            try:
                setup = prepare(landscape, Path(workloads), harsh=harsh)
            except MissingData as missing:
                plateaus[label] = {"skipped": str(missing)}
                continue
            _, truth = truth_for(name, setup, cache, adverse=adverse, harsh=harsh)
            exhaustive(setup, landscape, truth)
            if landscape.chunk_sweep:
                chunk_sweep(setup, truth)
            values = known_values(setup, truth, found)
            plateaus[label] = handed_plateau(values, optimum[label], budget, harsh=harsh)
    return plateaus


def table(paths: list[Path], budget: int) -> list[dict]:
    """Rows from ``--raw`` files, against each truth's best known optimum: the lattice's,
    the chunk sweep's, or a config some study launched off the lattice that is truly
    better."""
    records, optimum = read_raw(paths)
    groups: dict[tuple[str, str], list[StudyLog]] = {}
    for record in records:
        groups.setdefault((record["landscape"], record["strategy"]), []).append(logged(record))
    return [
        {
            "landscape": label,
            "strategy": strategy,
            "optimum_tok_s": round(optimum[label], 2),
            "optimum_over": "lattice and launched configs",
            **summarize(logs, budget, optimum[label], harsh=parse_label(label)[2]),
        }
        for (label, strategy), logs in groups.items()
    ]


def trace(paths: list[Path], seeds: list[int] | None = None) -> list[str]:
    """Each study of these ``--raw`` files (of ``seeds`` only, if given) launch by launch:
    the config's true value and what the launch measured, as shares of the best known
    config (``table``'s optimum, over every file), and its launch flags but those every
    launch of the study shares (a digest in raws written before flags were kept as a
    dict: none, or an argv list)."""
    records, optimum = read_raw(paths)
    lines: list[str] = []
    for record in records:
        if seeds is not None and record["seed"] not in seeds:
            continue
        best = optimum[record["landscape"]]
        crowned = record["handed_over"][-1] / best if record["handed_over"] else 0.0
        lines.append(
            f"{record['landscape']} {record['strategy']} seed {record['seed']}: crowned "
            f"{crowned:.3f} of the best known ({best:.2f} tok/s), best launched "
            f"{record['launched_best'] / best:.3f}"
        )
        flags = {d: f for d, f in record.get("flags", {}).items() if isinstance(f, dict)}
        shared = set.intersection(*map(_flag_items, flags.values())) if flags else set()
        launches = zip(
            record["launched"], record["launched_true"], record["launched_seen"], strict=True
        )
        for number, (digest, true, seen) in enumerate(launches, start=1):
            measured = f"{seen / best:.3f}" if seen else "failed"
            config = digest
            if digest in flags:
                own = {k: v for k, v in flags[digest].items() if _flag_item(k, v) not in shared}
                argv = TrialConfig(model="", flags=own).vllm_args()[1:]
                config = " ".join(argv) or "(the flags every launch shares)"
            lines.append(f"  {number:3d}  true {true / best:.3f}  measured {measured:>6}  {config}")
    return lines


def _flag_items(flags: dict) -> set[tuple[str, str]]:
    """A config's launch flags as comparable items (``_flag_item``)."""
    return {_flag_item(name, value) for name, value in flags.items()}


def _flag_item(name: str, value: Any) -> tuple[str, str]:
    """One launch flag, its value as JSON text: a dict value compares by its content."""
    return name, json.dumps(value, sort_keys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="README landscape, 5 seeds")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--launches", type=int, default=30)
    parser.add_argument("--landscape", action="append", choices=sorted(LANDSCAPES))
    parser.add_argument("--truth", choices=("truthful", "adverse"), action="append")
    parser.add_argument("--strategy", action="append", choices=list(STRATEGIES))
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--bench",
        choices=("harsh", "gentle", "both"),
        default="harsh",
        help="harsh: every figure noised, heavy tails, drift, the README's SLO; gentle: "
        "the earlier bench (throughput noise alone, no SLO); both: each landscape in each",
    )
    parser.add_argument(
        "--gentle", action="store_const", const="gentle", dest="bench", help="--bench gentle"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="studies run at once, in forked processes (default: one per core)",
    )
    parser.add_argument(
        "--cache", type=Path, help="keep every prediction in this file between runs (pickle)"
    )
    parser.add_argument("--raw", type=Path, help="append every study's log to this file")
    parser.add_argument(
        "--variant",
        help="name the code this run measures (a changed constant, say) in --raw, so that "
        "--table sets its studies beside the default's instead of merging them",
    )
    parser.add_argument(
        "--table",
        type=Path,
        nargs="+",
        help="no runs: the table of these --raw files, against the best known optimum",
    )
    parser.add_argument(
        "--plateau",
        action="store_true",
        help="with --table: under each truth's rows, how often an allocator handed the "
        "truth's plateau crowns within 1%% (its truth prepared again; --cache keeps it)",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        nargs="+",
        help="no runs: each study of these --raw files launch by launch (true value, "
        "what it measured, the launch flags)",
    )
    parser.add_argument(
        "--trace-seed", type=int, nargs="+", help="with --trace: only these studies' seeds"
    )
    args = parser.parse_args()
    if args.trace_seed and not args.trace:
        parser.error("--trace-seed picks studies of --trace RAW...: give the raw files")
    if args.plateau and not args.table:
        parser.error("--plateau reads the studies of --table RAW...: give the raw files")
    for path in [*(args.trace or []), *(args.table or [])]:
        if not path.is_file():
            parser.error(f"{path}: no such --raw file")
    if args.trace:
        print("\n".join(trace(args.trace, args.trace_seed)))
        return
    cache = load_cache(args.cache)
    cache["code"] = code_digest()
    if args.table:
        rows = table(args.table, args.launches)
        plateaus = table_plateaus(args.table, args.launches, cache) if args.plateau else {}
        for label in dict.fromkeys(row["landscape"] for row in rows):
            for row in (row for row in rows if row["landscape"] == label):
                if label in plateaus:
                    row["handed_plateau"] = plateaus[label]
                print(json.dumps(row) if args.json else format_row(row), flush=True)
            if label in plateaus and not args.json:
                print(format_plateau(plateaus[label]))
        if args.cache and args.plateau:
            args.cache.write_bytes(pickle.dumps(cache))
        return
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    names = args.landscape or (["readme"] if args.quick else list(LANDSCAPES))
    seeds = range(args.first_seed, args.first_seed + (5 if args.quick else args.seeds))
    strategies = args.strategy or list(STRATEGIES)
    if args.quick and not args.strategy:
        strategies = QUICK
        if not args.json:
            print(
                f"--quick runs {', '.join(QUICK)}. It leaves out gp: {GP_COST}; and the "
                "default's ablations (their studies would double its time). --strategy NAME "
                "runs any of them."
            )
    workloads = tempfile.TemporaryDirectory()
    modes = {"harsh": (True,), "gentle": (False,), "both": (False, True)}[args.bench]
    for name, harsh in ((name, harsh) for name in names for harsh in modes):
        landscape = LANDSCAPES[name]
        try:
            setup = prepare(landscape, Path(workloads.name), harsh=harsh)
        except MissingData as missing:
            print(f"\n{name}: skipped: {missing}", flush=True)
            continue
        setup["cache"] = cache.setdefault(f"{name}:tuner:{setup_key(setup)}", {})
        for adverse in (False, True) if landscape.adverse else (False,):
            if args.truth and ("adverse" if adverse else "truthful") not in args.truth:
                continue
            label, truth = truth_for(name, setup, cache, adverse=adverse, harsh=harsh)
            optimum, count, seconds = exhaustive(setup, landscape, truth)
            fill_tuner(
                setup, cache.setdefault("warm_start_s", {}), f"{name}:tuner:{setup_key(setup)}"
            )
            misled = misled_by(setup, truth)
            sweep = chunk_sweep(setup, truth) if landscape.chunk_sweep else None
            swept = sweep.best if sweep is not None else 0.0
            if args.cache:
                args.cache.write_bytes(pickle.dumps(cache))
            if not args.json:
                print(
                    f"\n{label}: {count} effective configs pass the pre-screen; truth optimum "
                    f"over them {optimum:,.1f} tok/s ({seconds:.0f} s to predict them all)\n"
                    f"  the tuner's simulator ranks it #{misled['truth_optimum_predicted_rank']}"
                    f"; its own optimum is {misled['predicted_to_true_distance']} away, "
                    f"{misled['predicted_optimum_true_share']:.3f} of the optimum in truth "
                    f"(the baseline {misled['baseline_true_share']:.3f})\n"
                    f"  the replay predicts them all in {setup['warm_start_s']:.0f} s here; "
                    f"a study's warm start: {warm_share(setup)}\n"
                    f"  truth optimum {misled['truth_optimum']}\n"
                    f"  predicted optimum {misled['predicted_optimum']}"
                )
                if sweep is not None:
                    print(sweep.describe(optimum))
            runs: list[tuple[str, list[StudyLog], float]] = []
            for strategy in strategies:
                started = time.monotonic()
                logs = []
                job = (label, setup, truth, max(optimum, swept), strategy, args.launches, harsh)
                for seed, log in zip(seeds, studies(job, seeds, args.jobs), strict=True):
                    logs.append(log)
                    if args.raw:
                        with args.raw.open("a") as out:
                            out.write(
                                json.dumps(
                                    study_record(
                                        label,
                                        strategy,
                                        seed,
                                        optimum,
                                        log,
                                        variant=args.variant,
                                        swept_optimum=swept,
                                    )
                                )
                            )
                            out.write("\n")
                runs.append((strategy, logs, time.monotonic() - started))
            # Every row against the best known config: the lattice's optimum or any config
            # a strategy launched (refined off-lattice ones included), whichever is truly best.
            known = max(
                [optimum, swept, *(log.launched_best for _, logs, _ in runs for log in logs)]
            )
            plateau = handed_plateau(
                known_values(setup, truth, [log for _, logs, _ in runs for log in logs]),
                known,
                args.launches,
                harsh=harsh,
            )
            for strategy, logs, seconds in runs:
                row = {
                    "landscape": label,
                    "strategy": strategy,
                    "optimum_tok_s": round(known, 2),
                    "optimum_over": "lattice and launched configs",
                    "known_over_lattice": round(known / optimum, 4),
                    **{k: v for k, v in misled.items() if not k.endswith("_optimum")},
                    **summarize(logs, args.launches, known, harsh=harsh),
                    "handed_plateau": plateau,
                    "seconds": round(seconds, 1),
                }
                print(json.dumps(row) if args.json else format_row(row), flush=True)
            if not args.json:
                print(format_plateau(plateau))
            if args.cache:
                args.cache.write_bytes(pickle.dumps(cache))
    if not args.json:
        print(f"\n({args.launches} launches per study; '-': not reached within them)")


def format_row(row: dict) -> str:
    def fmt(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:g}" if isinstance(value, int | float) else str(value)

    hours = row["median_gpu_hours_to_99"]
    low, high = row["winner_within_1pct_interval"]
    return (
        f"  {row['strategy']:<30} to99 med {fmt(row['median_launches_to_99']):>4} "
        f"worst {fmt(row['worst_launches_to_99']):>4} "
        f"| stays99 med {fmt(row.get('median_launches_to_stay_99')):>4} "
        f"worst {fmt(row.get('worst_launches_to_stay_99')):>4} "
        f"| launches {row.get('launches_per_study', 0):.1f} "
        f"(first {row.get('same_first_launches', 0)} alike in every seed) "
        f"| to95 med {fmt(row['median_launches_to_95']):>4} "
        f"worst {fmt(row['worst_launches_to_95']):>4} "
        f"| OOM/study {row['oom_launches_per_study']:.1f} "
        f"| GPU-h to99 {fmt(hours and round(hours, 2))} "
        f"| winner med {row['winner_median']:.3f} worst {row['winner_worst']:.3f} "
        f"within1% {row['winner_within_1pct_rate']:.0%} "
        f"({row['winners_within_1pct']}/{row['seeds']}, 95% CI "
        f"{low:.0%}-{high:.0%}; launched {row.get('launched_within_1pct', '-')}/{row['seeds']}, "
        f"oracle crown {row.get('oracle_crown_within_1pct', '-')}/{row['seeds']}) "
        f"| GPU-h/study {row['gpu_hours_per_study']:.2f} "
        f"pruned {row['pruned_per_study']:.1f} (winners {row['winners_pruned_per_study']:.1f}, "
        f"improvers {row['improvers_pruned_per_study']:.1f})"
        + (f" ({row['seconds']:.0f} s)" if "seconds" in row else f" [{row['landscape']}]")
    )


def format_plateau(plateau: dict) -> str:
    if "skipped" in plateau:
        return f"  handed the plateau: skipped: {plateau['skipped']}"
    return (
        f"  handed the plateau (the {plateau['configs']} configs truly within {PLATEAU:.0%} "
        f"of the best known, {plateau['within_1pct']} of them within 1%; not their order), "
        f"an allocator crowns within 1% in {plateau['rate']:.0%} of nights at best (configs "
        f"kept each round {'-'.join(map(str, plateau['allocation']))}: ``handed_plateau``)"
    )


if __name__ == "__main__":
    main()
