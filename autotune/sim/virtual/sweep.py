"""The hand-run closed-loop benchmark, predicted: concurrency x MTP on one configuration.

Mirrors the field notes' table: N clients, each sending fixed-size requests
back to back (its next request when the previous ends), aggregate output
tokens/s and mean latency per (concurrency, MTP) cell.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from autotune.errors import InputError
from autotune.replay.load import LoadSpec
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.config import SimConfig
from autotune.sim.model.memory import plan_memory
from autotune.sim.model.prompt import PromptRenderer
from autotune.sim.model.units import GIB
from autotune.sim.virtual.predict import predict
from autotune.workload.expand import expand
from autotune.workload.gen import fixed
from autotune.workload.plan import WorkloadPlan

REQUESTS_PER_CLIENT = 4  # enough rounds that arrivals and decodes interleave
# The field notes' card runs its calibrated settings unless told otherwise.
HARDWARE_BASELINES: dict[str, dict[str, object]] = {
    "rtx4080s-32g": {
        "kv_cache_memory_bytes": 9 * GIB,
        "kv_cache_dtype": "fp8_e4m3",
        "language_model_only": True,
    },
}


class SweepRow(BaseModel):
    """One cell of the closed-loop table."""

    model_config = ConfigDict(frozen=True)

    concurrency: int
    mtp: int
    output_tokens_per_s: float | None
    mean_latency_s: float | None
    duration_s: float | None  # modelled wall time of the whole run
    mean_ttft_s: float | None
    mean_tpot_s: float | None
    completed: int
    mean_acceptance_length: float | None
    preemptions: int | None
    kv_cache_tokens: int
    failure: str | None  # failure class when the configuration does not run
    expected_error: float | None = None  # the calibration profile's; None: uncalibrated


def _rejected_row(concurrency: int, mtp: int, reason: str) -> SweepRow:
    return SweepRow(
        concurrency=concurrency,
        mtp=mtp,
        output_tokens_per_s=None,
        mean_latency_s=None,
        duration_s=None,
        mean_ttft_s=None,
        mean_tpot_s=None,
        completed=0,
        mean_acceptance_length=None,
        preemptions=None,
        kv_cache_tokens=0,
        failure=f"invalid-args: {reason}",
    )


def baseline_config(hardware: str, model: str, **overrides: object) -> SimConfig:
    """``model`` on ``hardware`` with that card's baseline flags, then ``overrides``."""
    values: dict[str, object] = {"hardware": hardware, "model": model}
    values.update(HARDWARE_BASELINES.get(hardware, {}))
    values.update({key: value for key, value in overrides.items() if value is not None})
    return SimConfig.model_validate(values)


def closed_loop(
    concurrency: int, *, requests_per_client: int, prompt_tokens: int, output_tokens: int
) -> tuple[WorkloadPlan, LoadSpec]:
    """One cell's plan and load: ``concurrency`` clients, each sending
    ``requests_per_client`` fixed-size requests back to back, never stopped as saturated."""
    plan = expand(
        fixed(
            requests=concurrency * requests_per_client,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
        )
    )
    return plan, LoadSpec(mode="concurrency", concurrency=concurrency, saturation_stop=False)


def closed_loop_sweep(
    base: SimConfig,
    *,
    concurrencies: Sequence[int],
    mtps: Sequence[int],
    prompt_tokens: int,
    output_tokens: int,
    requests_per_client: int = REQUESTS_PER_CLIENT,
    seed: int = 0,
    calibration: CalibrationProfile | None = None,
) -> list[SweepRow]:
    """Predict every (concurrency, MTP) cell; raises InputError for a bad grid."""
    if not concurrencies or min(concurrencies) < 1:
        raise InputError(f"concurrency values must be >= 1, but got {list(concurrencies)}")
    if not mtps or min(mtps) < 0:
        raise InputError(f"mtp values must be >= 0, but got {list(mtps)}")
    plan_memory(base)  # unknown hardware, model or flag values fail the whole sweep
    if calibration is not None:
        calibration.check_applies(base)
    rows: list[SweepRow] = []
    for concurrency in concurrencies:
        plan, load = closed_loop(
            concurrency,
            requests_per_client=requests_per_client,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
        )
        renderer = PromptRenderer()
        for mtp in mtps:
            config = base.model_copy(update={"num_speculative_tokens": mtp})
            try:
                prediction = predict(
                    config, plan, load, seed=seed, renderer=renderer, calibration=calibration
                )
            except InputError as exc:  # e.g. MTP on a model without a draft head
                rows.append(_rejected_row(concurrency, mtp, str(exc)))
                continue
            stats, server = prediction.stats, prediction.server_stats
            ran = prediction.failure is None
            rows.append(
                SweepRow(
                    concurrency=concurrency,
                    mtp=mtp,
                    output_tokens_per_s=stats.output_throughput_tok_s if ran else None,
                    mean_latency_s=stats.e2e.mean if ran else None,
                    duration_s=stats.duration_s if ran else None,
                    mean_ttft_s=stats.ttft.mean if ran else None,
                    mean_tpot_s=stats.tpot.mean if ran else None,
                    completed=stats.completed,
                    mean_acceptance_length=server.spec_decode_mean_acceptance_length,
                    preemptions=server.preemptions,
                    kv_cache_tokens=prediction.memory.kv_cache_tokens,
                    failure=None if ran else prediction.failure.failure_class.value,  # type: ignore[union-attr]  # ran is False
                    expected_error=prediction.expected_error,
                )
            )
    return rows
