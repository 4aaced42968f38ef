"""Compare the best configs of several studies (GPUs, engine versions, models) in one table.

``--what-if GPU`` adds the simulator's prediction for GPUs the user does not
own: the study's space is tuned anew for that GPU on the simulator (its KV range
scaled to the card, the guided tuner's warm start; ``results/what_if.py``) and the config
it picks is shown beside its figures. Each figure is scaled by measured/predicted
of the study's best config on its own GPU, so the simulator's bias on this workload
cancels out. On the study's own GPU the what-if is the measured best, predicted.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict
from rich.table import Table

from autotune.catalog.hardware import get_gpu
from autotune.catalog.prices import SECONDS_PER_HOUR, price_for
from autotune.errors import InputError
from autotune.results.explain import format_flag_value
from autotune.results.reader import LoadedStudy, TrialRow
from autotune.results.study_inputs import (
    catalog_gpu,
    sim_config,
    study_gpu_names,
    study_plan,
)
from autotune.results.what_if import NoConfigStarts, TunedForGpu, tune_for_gpu
from autotune.sim.model.calibration_profile import CalibrationProfile
from autotune.sim.model.config import SimConfig
from autotune.sim.virtual.predict import Prediction, predict

SHORT_FLAGS = (
    "kv-cache-memory-bytes",
    "kv-cache-dtype",
    "max-num-seqs",
    "max-num-batched-tokens",
    "speculative-config",
)


class ComparisonRow(BaseModel):
    """One line of the comparison: a study's best config, measured or predicted."""

    model_config = ConfigDict(frozen=True)

    study: str
    label: str  # the column header: the study, or "<gpu> what-if"
    gpu: str
    engine_version: str | None
    model: str | None
    trial: int | None
    best_config: str
    output_throughput_tok_s: float | None
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    kv_cache_tokens: int | None
    concurrency_reached: int | None
    usd_per_hour: float | None = None
    source: str = "measured"  # "measured" | "predicted (simulator, calibrated x0.93)"

    @property
    def output_tokens_per_usd(self) -> float | None:
        if self.usd_per_hour is None or self.output_throughput_tok_s is None:
            return None
        return self.output_throughput_tok_s * SECONDS_PER_HOUR / self.usd_per_hour


def config_summary(row: TrialRow) -> str:
    """The flags that matter most, short: ``kv-cache-memory-bytes=12 GiB, ...``."""
    return flags_summary(row.flags)


def flags_summary(flags: dict[str, object]) -> str:
    """``config_summary`` of a config's flags."""
    shown = [
        f"{n}={format_flag_value(n, flags[n])}" for n in SHORT_FLAGS if flags.get(n) is not None
    ]
    return ", ".join(shown) or "(defaults)"


def compare_rows(
    studies: list[LoadedStudy], *, prices: dict[str, float] | None = None
) -> list[ComparisonRow]:
    """One measured row per study: its best feasible trial."""
    rows = []
    for loaded in studies:
        if not loaded.feasible_measured():
            rows.append(_no_result_row(loaded))
            continue
        best = loaded.best()
        rows.append(
            ComparisonRow(
                study=loaded.name,
                label=loaded.name,
                gpu=loaded.info.gpu_name,
                engine_version=best.engine_version or loaded.info.engine_version,
                model=loaded.info.model,
                trial=best.number,
                best_config=config_summary(best),
                output_throughput_tok_s=loaded.throughput_of(best),
                ttft_p95_s=best.ttft_p95_s,
                tpot_p95_s=best.tpot_p95_s,
                kv_cache_tokens=best.kv_cache_tokens,
                concurrency_reached=best.concurrency_reached,
                usd_per_hour=price_for(prices or {}, loaded.name, *study_gpu_names(loaded)),
            )
        )
    return rows


def _empty_row(
    loaded: LoadedStudy,
    *,
    label: str,
    gpu: str,
    best_config: str,
    source: str,
    usd_per_hour: float | None = None,
) -> ComparisonRow:
    """A row with no figures: nothing measured that was feasible, or nothing starts."""
    return ComparisonRow(
        study=loaded.name,
        label=label,
        gpu=gpu,
        engine_version=loaded.info.engine_version,
        model=loaded.info.model,
        trial=None,
        best_config=best_config,
        output_throughput_tok_s=None,
        ttft_p95_s=None,
        tpot_p95_s=None,
        kv_cache_tokens=None,
        concurrency_reached=None,
        usd_per_hour=usd_per_hour,
        source=source,
    )


def _no_result_row(loaded: LoadedStudy) -> ComparisonRow:
    return _empty_row(
        loaded,
        label=loaded.name,
        gpu=loaded.info.gpu_name,
        best_config="(no feasible trial yet)",
        source=f"measured: {len(loaded.trials)} trials, none feasible",
    )


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return measured / predicted


def _scaled(value: float | None, ratio: float | None) -> float | None:
    """``value`` calibrated by ``ratio``; uncalibrated (as predicted) when there is none."""
    if value is None:
        return None
    return value if ratio is None else value * ratio


def _applying(
    calibration: CalibrationProfile | None, config: SimConfig
) -> CalibrationProfile | None:
    """``calibration`` when it was fitted for ``config``'s GPU and model (or for any)."""
    if calibration is None or calibration.hardware not in (None, config.hardware):
        return None
    return calibration if calibration.model in (None, config.model) else None


def what_if_rows(
    studies: list[LoadedStudy],
    gpus: list[str],
    *,
    prices: dict[str, float] | None = None,
    calibration: CalibrationProfile | None = None,
    say: Callable[[str], None] | None = None,
) -> list[ComparisonRow]:
    """Per study and GPU, the config tuned for that GPU on the simulator, as the calibrated
    simulator predicts it (the study's own GPU: its measured best, predicted).

    ``calibration``: a profile (``autotune sim calibrate``) used for every
    prediction on the GPU and model it was fitted for; InputError if it fits
    none of them. ``say`` hears each tuning's progress (a warm start per GPU).
    """
    for gpu in gpus:
        get_gpu(gpu)
    rows = []
    used = False
    for loaded in studies:
        best = loaded.best()
        if best.config is None:
            raise InputError(f"study {loaded.name!r}: trial {best.number} stored no config")
        plan, load = study_plan(loaded)
        own = catalog_gpu(loaded)
        own_config = sim_config(best.config, own)
        own_profile = _applying(calibration, own_config)
        own_prediction = predict(own_config, plan, load, calibration=own_profile)
        own_stats = own_prediction.stats
        ratios: dict[str, float | None] = {"throughput": None, "ttft": None, "tpot": None}
        if own_prediction.failure is None:  # else nothing to calibrate against: raw figures
            ratios = {
                "throughput": _ratio(best.throughput_tok_s, own_stats.output_throughput_tok_s),
                "ttft": _ratio(best.ttft_p95_s, own_stats.ttft.p95),
                "tpot": _ratio(best.tpot_p95_s, own_stats.tpot.p95),
            }
        for gpu in gpus:
            config = sim_config(best.config, gpu)
            profile = _applying(calibration, config)
            used = used or profile is not None or own_profile is not None
            if gpu == own:  # tuned for real: the measured best, predicted
                prediction = predict(config, plan, load, calibration=profile)
                rows.append(_predicted_row(loaded, best, gpu, prediction, ratios, own, prices))
                continue
            try:
                tuned = tune_for_gpu(
                    loaded, gpu, plan=plan, load=load, calibration=profile, say=say
                )
            except NoConfigStarts as exc:
                rows.append(_nothing_starts_row(loaded, gpu, str(exc), prices))
                continue
            rows.append(_tuned_row(loaded, tuned, ratios, own, prices))
    if calibration is not None and not used:
        raise InputError(
            f"calibration profile {calibration.name} (hardware "
            f"{calibration.hardware}, model {calibration.model}) fits none of the compared "
            "GPUs and models"
        )
    return rows


def _predicted_row(
    loaded: LoadedStudy,
    best: TrialRow,
    gpu: str,
    prediction: Prediction,
    ratios: dict[str, float | None],
    own: str,
    prices: dict[str, float] | None,
) -> ComparisonRow:
    stats = prediction.stats
    ran = prediction.failure is None
    calibration = ratios["throughput"]
    source = (
        f"predicted (simulator x{calibration:.2f}, calibrated on {own})"
        if calibration is not None
        else f"predicted (simulator, uncalibrated: it does not run this config on {own})"
    )
    if not ran:
        source = f"predicted: {prediction.failure.failure_class} on {gpu}"
    return ComparisonRow(
        study=loaded.name,
        label=f"{gpu} what-if",
        gpu=gpu,
        engine_version=loaded.info.engine_version,
        model=loaded.info.model,
        trial=best.number,
        best_config=config_summary(best),
        output_throughput_tok_s=_scaled(stats.output_throughput_tok_s, calibration)
        if ran
        else None,
        ttft_p95_s=_scaled(stats.ttft.p95, ratios["ttft"]) if ran else None,
        tpot_p95_s=_scaled(stats.tpot.p95, ratios["tpot"]) if ran else None,
        kv_cache_tokens=prediction.memory.kv_cache_tokens if prediction.memory.fits else None,
        concurrency_reached=prediction.server_stats.peak_running if ran else None,
        usd_per_hour=price_for(prices or {}, gpu),
        source=source,
    )


def _tuned_row(
    loaded: LoadedStudy,
    tuned: TunedForGpu,
    ratios: dict[str, float | None],
    own: str,
    prices: dict[str, float] | None,
) -> ComparisonRow:
    """A what-if column for a GPU the study's space was tuned for on the simulator."""
    prediction, stats = tuned.prediction, tuned.prediction.stats
    ran = prediction.failure is None
    calibration = ratios["throughput"]
    searched = f"best of {tuned.predicted_feasible:,} of {tuned.configs:,} configs"
    if tuned.kv_range_gib is not None:
        low, high = tuned.kv_range_gib
        searched += f", KV {low:g}-{high:g} GiB"
    if not tuned.meets_limits:
        searched += "; none predicted to meet the SLOs: the nearest"
    scale = (
        f"x{calibration:.2f}, calibrated on {own}"
        if calibration is not None
        else f"uncalibrated: the simulator does not run the best config on {own}"
    )
    source = f"predicted: tuned for {tuned.gpu} on the simulator ({searched}; {scale})"
    if not ran:
        source = f"predicted: {prediction.failure.failure_class} on {tuned.gpu}"
    return ComparisonRow(
        study=loaded.name,
        label=f"{tuned.gpu} what-if",
        gpu=tuned.gpu,
        engine_version=loaded.info.engine_version,
        model=loaded.info.model,
        trial=None,
        best_config=flags_summary(dict(tuned.config.flags)),
        output_throughput_tok_s=_scaled(stats.output_throughput_tok_s, calibration)
        if ran
        else None,
        ttft_p95_s=_scaled(stats.ttft.p95, ratios["ttft"]) if ran else None,
        tpot_p95_s=_scaled(stats.tpot.p95, ratios["tpot"]) if ran else None,
        kv_cache_tokens=prediction.memory.kv_cache_tokens if prediction.memory.fits else None,
        concurrency_reached=prediction.server_stats.peak_running if ran else None,
        usd_per_hour=price_for(prices or {}, tuned.gpu),
        source=source,
    )


def _nothing_starts_row(
    loaded: LoadedStudy, gpu: str, reason: str, prices: dict[str, float] | None
) -> ComparisonRow:
    return _empty_row(
        loaded,
        label=f"{gpu} what-if",
        gpu=gpu,
        best_config="(none starts)",
        source=f"predicted: {reason}",
        usd_per_hour=price_for(prices or {}, gpu),
    )


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def comparison_table(rows: list[ComparisonRow]) -> Table:
    """The rich table, one column per study (predicted columns say so in ``source``)."""
    table = Table(title="Best configuration per study", show_lines=True)
    table.add_column("", style="bold")
    for row in rows:
        table.add_column(row.label, overflow="fold")
    lines: list[tuple[str, list[str]]] = [
        ("study", [row.study for row in rows]),
        ("source", [row.source for row in rows]),
        ("GPU", [row.gpu for row in rows]),
        ("engine", [row.engine_version or "-" for row in rows]),
        ("model", [row.model or "-" for row in rows]),
        ("trial", ["-" if row.trial is None else str(row.trial) for row in rows]),
        ("best config", [row.best_config for row in rows]),
        ("output tok/s", [_fmt(row.output_throughput_tok_s, ",.1f") for row in rows]),
        ("p95 TTFT (s)", [_fmt(row.ttft_p95_s, ".3f") for row in rows]),
        ("p95 TPOT (s)", [_fmt(row.tpot_p95_s, ".4f") for row in rows]),
        ("KV cache tokens", [_fmt(row.kv_cache_tokens, ",") for row in rows]),
        ("peak running", [_fmt(row.concurrency_reached, "d") for row in rows]),
    ]
    if any(row.usd_per_hour is not None for row in rows):
        lines.append(("USD per hour", [_fmt(row.usd_per_hour, ".2f") for row in rows]))
        lines.append(
            ("output tok per USD", [_fmt(row.output_tokens_per_usd, ",.0f") for row in rows])
        )
    for label, cells in lines:
        table.add_row(label, *cells)
    return table
