"""A study's measured trials as calibration targets (``sim calibrate --from-study``).

Each trial the server ran and the replay measured becomes a target: its
stored launch config read by the simulator's flag parser (on the catalog GPU
and model given, since a real study names a model path or hub id), the
study's own workload and load (checked against the stored digest), and what
it measured: output tok/s, mean end-to-end latency, and vLLM's mean
acceptance length from ``/metrics`` when MTP ran (which fixes acceptance
directly). The KV capacity its startup log reported rides along, so the
report shows whether the memory model agrees.
"""

from __future__ import annotations

from autotune.calibration.fit import Target
from autotune.errors import InputError
from autotune.results.reader import LoadedStudy
from autotune.results.study_inputs import study_plan
from autotune.sim.server.flags import parse_serve_args


def study_targets(loaded: LoadedStudy, *, hardware: str, model: str) -> list[Target]:
    """Every measured trial of ``loaded`` as a target on catalog ``hardware`` / ``model``."""
    plan, load = study_plan(loaded)
    targets = []
    for trial in loaded.trials:
        replay = trial.replay
        if not trial.measured or trial.config is None or replay is None:
            continue
        if not replay.completed or replay.e2e.mean is None or replay.output_throughput_tok_s <= 0:
            continue
        argv = [model, *trial.config.vllm_args()[1:], "--hardware", hardware]
        try:
            config = parse_serve_args(argv).sim
        except SystemExit as exc:  # argparse has printed why
            raise InputError(
                f"study {loaded.name!r}: trial {trial.number}: the simulator cannot read "
                f"its config {argv}"
            ) from exc
        stats = trial.server_stats
        targets.append(
            Target(
                label=f"trial {trial.number}",
                config=config,
                plan=plan,
                load=load,
                tok_s=replay.output_throughput_tok_s,
                latency_s=replay.e2e.mean,
                acceptance_length=stats.spec_decode_mean_acceptance_length if stats else None,
                kv_cache_tokens=trial.startup.kv_cache_tokens if trial.startup else None,
            )
        )
    if not targets:
        raise InputError(f"study {loaded.name!r} has no measured trial to calibrate from")
    return targets
