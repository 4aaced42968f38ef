"""The README quick start's warm start: today's path (the baseline commit) against ours.

Each measurement is a fresh process that sets the quick start up as ``autotune run``
does (``prepare_study``: pre-flight, replay sizing) and then times ``make_tuner``: the
enumeration of the space, the memory pre-screen, the predictions and the seeds, which
is the warm start the run's "warm start: ... in N s" line reports. Rows:

- baseline, cold: the baseline commit's code (``git archive`` of ``--baseline-ref``)
- ours, cold: this tree, an empty prediction cache (a fresh clone)
- ours, warm: this tree again, the disk cache the cold run left (a second study)
- ours, resume: this tree, the study's stored predictions only, no disk cache (a
  resume or ``autotune worker`` on another host)
- resumed run, first trial: a real ``autotune run`` of the quick start resumed with the
  disk cache off, seconds from its start to its first trial's start line
- what-if h200-141g, baseline / ours: ``compare --what-if h200-141g`` of the quick start's
  study (results/what_if.py): its space with max-model-len as the run sized it and the KV
  range scaled to the H200, pre-screened by the H200's memory model and predicted over
  the quick start's workload (``build_guide`` with no budget and no prediction cache)

Then both trees run the quick start's 20 trials (``--seed 1``) with every trial measured
as the simulator predicts it (no wall clock, so no jitter between the runs): the trials
are compared: the same launches or not (``--no-decisions`` skips it).

Seconds are wall time, CPU seconds those of the process and its worker processes. The
cold rows' replays are compared (where ours replayed a config, its score must be the
baseline's), and their seeds (the same, where the two tiers find the same top). The machine's
load average is printed before and after (a shared machine: compare the ratio).

    python scripts/bench_warm_start.py [--jobs N] [--baseline-ref 85f3055] [--no-decisions] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "workloads" / "sample-claudecode.jsonl"
QUICK_START = [
    "--objective", "throughput", "--workload", str(WORKLOAD), "--engine", "sim",
    "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--slo", "ttft_p95<=20s",
]  # fmt: skip
STUDY = "bench"


# ----------------------------------------------------------------- in a child process
def _run_setup() -> tuple[Any, Any]:
    """``RunOptions`` and ``prepare_study`` in this tree, or in the baseline's, which keeps
    them in ``autotune/run_setup.py`` (before the package was grouped into folders)."""
    try:
        from autotune.study.setup import RunOptions, prepare_study
    except ImportError:
        from autotune.run_setup import RunOptions, prepare_study  # type: ignore[no-redef]
    return RunOptions, prepare_study


def quick_start_options(options_type: Any, storage: str, **more: Any) -> Any:
    """The README quick start's ``RunOptions`` (of this tree or the baseline's), stored in
    ``storage``; ``more`` adds or replaces fields."""
    return options_type(
        objective="throughput",
        workload=WORKLOAD,
        engine="sim",
        hardware="rtx4080s-32g",
        model="qwen3.6-27b-awq",
        trials=20,
        slos=["ttft_p95<=20s"],
        storage=storage,
        **more,
    )


def _seeded(options_type: Any, seed: int) -> dict[str, Any]:
    """The seed as ``RunOptions`` takes it: in its tuner settings, or (the baseline) itself."""
    if "tuner" in options_type.model_fields:
        from autotune.tuner.settings import TunerSettings

        return {"tuner": TunerSettings(seed=seed)}
    return {"seed": seed}


def measure(mode: str, scratch: Path, jobs: int | None) -> dict[str, Any]:
    """One warm start of the quick start (``mode``: baseline, cold, warm, resume)."""
    from autotune.study.loop import make_tuner

    RunOptions, prepare_study = _run_setup()

    if jobs is not None:  # the worker processes of both paths
        if mode == "baseline":
            import autotune.tuner.predictor as predictor

            predictor.MAX_WORKERS = jobs
        else:
            import autotune.tuner.forked as forked

            forked.MAX_WORKERS = jobs
    storage = f"sqlite:///{scratch / 'studies.db'}"
    options = quick_start_options(RunOptions, storage)
    spec = prepare_study(options)
    cache = None
    if mode != "baseline":
        import optuna

        from autotune.tuner.prediction_cache import CachedPredictions, read_stored

        stored = None
        if mode == "resume":
            stored = read_stored(optuna.storages.RDBStorage(storage), STUDY)
            assert stored is not None, "the cold run stores the predictions first"
        disk = None if mode == "resume" else scratch / "predictions.sqlite"
        cache = spec.prediction_cache = CachedPredictions(spec.oracle, disk=disk, stored=stored)
    started = time.monotonic()
    tuner = make_tuner(spec, spec.engine.version())
    seconds = time.monotonic() - started
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    guide = tuner.guide
    assert guide is not None
    if cache is not None:
        cache.close()
        if mode == "cold":  # what the run stores in its study, for the resume row
            import optuna

            study = optuna.create_study(study_name=STUDY, storage=storage)
            cache.store(study, [candidate.key for candidate in guide.candidates])
    scores = {
        c.key: None if s is None else [s.values, s.constraints, s.outcome]
        for c, s in zip(guide.candidates, guide.scores or [], strict=True)
    }
    cached = getattr(guide, "cached", 0)
    return {
        "mode": mode,
        "seconds": seconds,
        "cpu_s": sum(u.ru_utime + u.ru_stime for u in usage),
        "configs": len(guide.candidates),
        "predicted": replays(guide, cached),
        "replayed": replayed_keys(guide),
        "cached": cached,
        "seeds": [seed.key for seed in guide.diverse_top(tuner.settings.warm_start)],
        "scores": scores,
    }


def replays(guide: Any, cached: int) -> int:
    """The replays a warm start made: ours, the configs it did not leave to the screen;
    the baseline's (no screen), every config it predicted."""
    screened = getattr(guide, "screened", None)
    if screened is not None:
        return int((~screened).sum()) - cached
    return len(guide.candidates) - cached - int(guide.unpredicted.sum())


def replayed_keys(guide: Any) -> list[str]:
    """The configs a warm start replayed (the baseline's: every one)."""
    screened = getattr(guide, "screened", None)
    if screened is None:
        return [c.key for c in guide.candidates]
    return [c.key for c, alone in zip(guide.candidates, screened, strict=True) if not alone]


def measure_what_if(scratch: Path, jobs: int | None, gpu: str = "h200-141g") -> dict[str, Any]:
    """The quick start's space tuned for ``gpu`` as ``compare --what-if`` does, predicted
    whole (no budget, no prediction cache): seconds and CPU seconds of ``build_guide``."""
    from autotune.trial.prescreen import make_prescreen
    from autotune.tuner.guide import build_guide
    from autotune.tuner.kv_bounds import largest_kv_pool_bytes, shaped
    from autotune.tuner.predictor import SimOracle

    RunOptions, prepare_study = _run_setup()
    if jobs is not None:
        import autotune.tuner.forked as forked

        forked.MAX_WORKERS = jobs
    options = quick_start_options(RunOptions, f"sqlite:///{scratch / 'what-if.db'}")
    spec = prepare_study(options)  # the study's space: max-model-len as the run sized it
    plan = spec.oracle.plan
    longest = max((request.prompt_tokens for request in plan.requests), default=0)
    prescreen = make_prescreen(hardware=gpu, sim_model="qwen3.6-27b-awq", max_prompt_tokens=longest)
    space, version = spec.space, spec.engine.version()
    largest = largest_kv_pool_bytes(
        space, model=spec.model, engine_version=version, prescreen=prescreen
    )
    if largest is not None:
        space = shaped(space, largest)
    oracle = SimOracle(
        hardware=gpu, sim_model="qwen3.6-27b-awq", plan=plan, load=spec.oracle.load,
        goal=spec.oracle.goal,
    )  # fmt: skip
    started = time.monotonic()
    guide = build_guide(
        space, model=spec.model, engine_version=version, prescreen=prescreen, oracle=oracle,
        maximize=True, budget_s=None,
    )  # fmt: skip
    seconds = time.monotonic() - started
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    scores = {
        c.key: None if s is None else [s.values, s.constraints, s.outcome]
        for c, s in zip(guide.candidates, guide.scores or [], strict=True)
    }
    return {
        "mode": "what-if",
        "seconds": seconds,
        "cpu_s": sum(u.ru_utime + u.ru_stime for u in usage),
        "configs": len(guide.candidates),
        "predicted": replays(guide, 0),
        "replayed": replayed_keys(guide),
        "cached": 0,
        "scores": scores,
    }


def predicted_measure(spec: Any, config: Any, log_path: Path, on_progress: Any = None) -> Any:
    """A trial measured as the simulator predicts it (noise 0, no wall clock): the same
    measurements for both trees, so their decisions can be compared trial by trial."""
    try:
        from autotune.trial.run import TrialResult
    except ImportError:  # the baseline's layout
        from autotune.trial import TrialResult  # type: ignore[no-redef, attr-defined]

    result = TrialResult(config=config)
    result.memory = spec.prescreen(config) if spec.prescreen is not None else None
    if spec.skip_predicted_oom and result.memory is not None and not result.memory.fits:
        result.outcome_override = "predicted-oom"
        return result
    prediction = spec.oracle.predict(config)
    result.argv = config.vllm_args()
    result.startup, result.failure = prediction.startup, prediction.failure
    result.server_stats = prediction.server_stats
    if prediction.failure is None:
        result.stats, result.records = prediction.stats, prediction.records
    return result


def decisions(scratch: Path) -> list[list[Any]]:
    """The quick start's 20 trials (``--seed 1``), each measured as predicted: what each
    trial launched, why, and its value."""
    from autotune.study import run_study

    RunOptions, prepare_study = _run_setup()
    options = quick_start_options(
        RunOptions,
        f"sqlite:///{scratch / 'decisions.db'}",
        **_seeded(RunOptions, 1),
        artifacts_dir=scratch / "artifacts",
    )
    spec = prepare_study(options)
    spec.measure = predicted_measure
    study = run_study(spec)
    roles = ("is_baseline", "warm_start", "confirms", "neighbour_of", "duplicate_of")
    return [
        [
            trial.number,
            trial.params,
            {key: trial.user_attrs.get(key) for key in roles},
            trial.values,
        ]
        for trial in study.trials
    ]


# --------------------------------------------------------------------- the parent
def baseline_tree(ref: str, into: Path) -> Path:
    """The package and its search spaces as commit ``ref`` has them, unpacked under
    ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "autotune", "search_spaces"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def child(mode: str, scratch: Path, jobs: int | None, pythonpath: Path | None) -> Any:
    env = {**os.environ, "PYTHONPATH": str(pythonpath or REPO)}
    argv = [sys.executable, __file__, "--child", mode, "--scratch", str(scratch)]
    argv += ["--jobs", str(jobs)] if jobs else []
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=scratch)
    if done.returncode != 0:
        raise SystemExit(f"the {mode} measurement failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def resumed_run_first_trial_s(scratch: Path, cache: Path) -> float:
    """A real quick start run to one trial (its predictions from ``cache``), then resumed
    with the disk cache off: seconds from the resume's start to its first trial's start."""
    argv = [sys.executable, "-m", "autotune", "run", *QUICK_START]
    argv += ["--storage", f"sqlite:///{scratch / 'cli.db'}", "--study", STUDY]
    env = {**os.environ, "AUTOTUNE_PREDICTION_CACHE": str(cache)}
    subprocess.run([*argv, "--trials", "1"], env=env, cwd=scratch, check=True, capture_output=True)
    env["AUTOTUNE_PREDICTION_CACHE"] = "off"
    started = time.monotonic()
    first_s = None
    with subprocess.Popen(
        [*argv, "--trials", "2"], env=env, cwd=scratch, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if first_s is None and re.search(r"trial 1 \[2/2\] starts", line):
                first_s = time.monotonic() - started
        process.wait()
    if process.returncode != 0 or first_s is None:
        raise SystemExit(f"the resumed run failed (exit {process.returncode})")
    return first_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, help="worker processes (default: as autotune run)")
    parser.add_argument("--baseline-ref", default="85f3055")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--no-decisions",
        dest="decisions",
        action="store_false",
        help="skip running the quick start's 20 trials on both trees to compare decisions",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "decisions":
        print(json.dumps(decisions(args.scratch)))
        return
    if args.child == "what-if":
        print(json.dumps(measure_what_if(args.scratch, args.jobs)))
        return
    if args.child:
        print(json.dumps(measure(args.child, args.scratch, args.jobs)))
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = baseline_tree(args.baseline_ref, root / "baseline")
        for name in ("base", "ours"):
            (root / name).mkdir()
        rows = [child("baseline", root / "base", args.jobs, base)]
        for mode in ("cold", "warm", "resume"):
            rows.append(child(mode, root / "ours", args.jobs, None))
        for name in ("base-what-if", "ours-what-if"):
            (root / name).mkdir()
        what_if = [
            child("what-if", root / "base-what-if", args.jobs, base),
            child("what-if", root / "ours-what-if", args.jobs, None),
        ]
        cache = root / "ours" / "predictions.sqlite"  # what the cold row left
        first_trial_s = resumed_run_first_trial_s(root / "ours", cache)
        same_decisions = None
        if args.decisions:
            for name in ("base-decisions", "ours-decisions"):
                (root / name).mkdir()
            theirs = child("decisions", root / "base-decisions", args.jobs, base)
            ours = child("decisions", root / "ours-decisions", args.jobs, None)
            same_decisions = theirs == ours
    load_after = os.getloadavg()
    baseline, cold = rows[0], rows[1]
    # Where ours replayed a config, its score is the baseline's (the same replay).
    same_scores = all(baseline["scores"][key] == cold["scores"][key] for key in cold["replayed"])
    same_seeds = baseline["seeds"] == cold["seeds"]
    figures = {
        "rows": [{k: v for k, v in row.items() if k not in ("scores", "replayed")} for row in rows],
        "what_if": [
            {k: v for k, v in row.items() if k not in ("scores", "replayed")} for row in what_if
        ],
        "what_if_identical_predictions": all(
            what_if[0]["scores"][key] == what_if[1]["scores"][key] for key in what_if[1]["replayed"]
        ),
        "what_if_ratio": what_if[0]["seconds"] / what_if[1]["seconds"],
        "resumed_run_first_trial_s": first_trial_s,
        "identical_predictions": same_scores,
        "identical_seeds": same_seeds,
        "identical_decisions": same_decisions,
        "cold_ratio": baseline["seconds"] / cold["seconds"],
        "cold_cpu_ratio": baseline["cpu_s"] / cold["cpu_s"],
        "jobs": args.jobs,
        "cpus": len(os.sched_getaffinity(0)),
        "load_before": load_before,
        "load_after": load_after,
    }
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    print_table(figures, args.baseline_ref)


def print_table(figures: dict[str, Any], ref: str) -> None:
    from rich.console import Console
    from rich.table import Table

    labels = {
        "baseline": f"baseline ({ref}), cold",
        "cold": "ours, cold (empty cache)",
        "warm": "ours, warm (disk cache)",
        "resume": "ours, resume (study only)",
    }
    rows = figures["rows"]
    base_s, base_cpu = rows[0]["seconds"], rows[0]["cpu_s"]
    table = Table(title="The quick start's warm start")
    for column in ("path", "configs", "replayed", "from cache", "seconds", "CPU s", "ratio"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for row in rows:
        table.add_row(
            labels[row["mode"]], f"{row['configs']:,}", f"{row['predicted']:,}",
            f"{row['cached']:,}", f"{row['seconds']:.1f}", f"{row['cpu_s']:.1f}",
            f"{base_s / row['seconds']:.2f}x",
        )  # fmt: skip
    table.add_row(
        "resumed autotune run, to its first trial", "", "", "",
        f"{figures['resumed_run_first_trial_s']:.1f}", "", "",
    )  # fmt: skip
    base_what_if = figures["what_if"][0]
    for name, row in zip(("baseline", "ours"), figures["what_if"], strict=True):
        table.add_row(
            f"what-if h200-141g, {name}", f"{row['configs']:,}", f"{row['predicted']:,}", "",
            f"{row['seconds']:.1f}", f"{row['cpu_s']:.1f}",
            f"{base_what_if['seconds'] / row['seconds']:.2f}x",
        )  # fmt: skip
    console = Console()
    console.print(table)
    console.print(
        f"CPU ratio, cold: {base_cpu / rows[1]['cpu_s']:.2f}x; replays as the baseline's: "
        f"{figures['identical_predictions']}, identical seeds: {figures['identical_seeds']}, "
        f"identical trials (measured as predicted, --seed 1): {figures['identical_decisions']}; "
        f"what-if replays as the baseline's: {figures['what_if_identical_predictions']}; "
        f"{figures['cpus']} CPUs, --jobs {figures['jobs'] or 'default'}; load average "
        + " / ".join(f"{x:.1f}" for x in figures["load_before"])
        + " before, "
        + " / ".join(f"{x:.1f}" for x in figures["load_after"])
        + " after"
    )


if __name__ == "__main__":
    main()
