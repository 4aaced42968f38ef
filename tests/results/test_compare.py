from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
from rich.console import Console

from autotune.catalog.prices import parse_prices, price_for
from autotune.errors import InputError
from autotune.results.compare import (
    compare_rows,
    comparison_table,
    what_if_rows,
)
from autotune.results.reader import load_study
from autotune.results.study_inputs import study_plan

from .conftest import Point, build_study, on_the_catalog_gpu


def test_prices_parse_and_match_gpu_names_loosely() -> None:
    prices = parse_prices(["RTX-4080=0.35", "h100=2.49"])
    assert prices == {"RTX-4080": 0.35, "h100": 2.49}
    assert price_for(prices, "NVIDIA GeForce RTX 4080 SUPER 32GB") == 0.35
    assert price_for(prices, "NVIDIA H100 80GB HBM3") == 2.49
    assert price_for(prices, "NVIDIA A10G") is None
    for bad in ("h100", "h100=free", "=1", "h100=-2"):
        with pytest.raises(InputError, match="expected GPU=USD_PER_HOUR"):
            parse_prices([bad])


def test_table_compares_best_configs_with_cost(storage_url: str) -> None:
    build_study(storage_url, "a")
    build_study(storage_url, "b", multi_objective=True)
    rows = compare_rows(
        [load_study(storage_url, "a"), load_study(storage_url, "b")],
        prices={"rtx 4080": 0.5},
    )
    assert [row.trial for row in rows] == [7, 7]
    assert rows[0].output_tokens_per_usd == pytest.approx(608.0 * 3600 / 0.5)
    assert rows[0].best_config.startswith("kv-cache-memory-bytes=12 GiB, kv-cache-dtype=fp8_e4m3")
    console = Console(width=200, record=True)
    console.print(comparison_table(rows))
    text = console.export_text()
    assert "4,377,600" in text  # output tokens per USD
    assert "293,350" in text
    assert text.count("measured") == 2


def test_what_if_is_calibrated_on_the_studys_own_gpu_and_tuned_for_the_others(
    storage_url: str,
) -> None:
    """Before: every GPU got the 32 GB card's best config (6-10 GiB of KV on an 80 GB
    card). Now the space is tuned for each on the simulator and the pick is shown."""
    # configs the simulated 4080 Super runs, so there is something to calibrate against
    points = [Point(6.0, "auto", 8, 0, baseline=True), Point(10.0, "fp8_e4m3", 8, 0)]
    build_study(storage_url, "a", points=points)
    on_the_catalog_gpu(storage_url, "a")
    loaded = load_study(storage_url, "a")
    heard: list[str] = []
    own, h100, small = what_if_rows(
        [loaded],
        ["rtx4080s-32g", "h100-80g", "rtx4090-24g"],
        prices={"h100": 2.49},
        say=heard.append,
    )
    # on its own GPU the calibrated prediction gives back what was measured
    best = loaded.best()
    assert own.output_throughput_tok_s == pytest.approx(best.throughput_tok_s)
    assert own.ttft_p95_s == pytest.approx(best.ttft_p95_s)
    assert own.source.startswith("predicted (simulator x") and "rtx4080s-32g" in own.source
    assert own.best_config == compare_rows([loaded])[0].best_config
    # on the H100 the space was tuned anew: KV scaled to the 80 GB card, the pick shown
    assert h100.source.startswith("predicted: tuned for h100-80g on the simulator")
    assert "calibrated on rtx4080s-32g" in h100.source
    assert h100.best_config != own.best_config
    kv_gib = float(re.search(r"kv-cache-memory-bytes=([\d.]+) GiB", h100.best_config)[1])  # type: ignore[index]
    assert kv_gib > 14  # past anything the 32 GB card's space allows
    assert h100.kv_cache_tokens > 2 * own.kv_cache_tokens  # type: ignore[operator]
    assert h100.output_throughput_tok_s > own.output_throughput_tok_s  # type: ignore[operator]
    assert h100.usd_per_hour == 2.49
    # on the 24 GB card no pool beside the weights holds the workload's 34k-token request
    assert small.output_throughput_tok_s is None and small.best_config == "(none starts)"
    assert small.source.startswith("predicted: no config of the space starts on rtx4090-24g")
    assert any("Warm start: screening" in line for line in heard)
    console = Console(width=250, record=True)
    console.print(comparison_table([*compare_rows([loaded]), own, h100, small]))
    assert "h100-80g what-if" in console.export_text()


def test_what_if_needs_the_same_workload_and_a_catalog_gpu(
    storage_url: str, tmp_path: Path
) -> None:
    build_study(storage_url, "a")
    on_the_catalog_gpu(storage_url, "a")
    study = optuna.load_study(study_name="a", storage=storage_url)
    workload = study.user_attrs["workload"]
    study.set_user_attr("workload", {**workload, "path": str(tmp_path / "gone.jsonl")})
    with pytest.raises(InputError, match=r"workload file .*gone\.jsonl is gone"):
        what_if_rows([load_study(storage_url, "a")], ["h100-80g"])
    study.set_user_attr("workload", {**workload, "digest": "sha256:other"})
    with pytest.raises(InputError, match=r"sample-claudecode\.jsonl changed since the study ran"):
        what_if_rows([load_study(storage_url, "a")], ["h100-80g"])
    study.set_user_attr("workload", workload)
    with pytest.raises(InputError, match="unknown hardware 'b200'"):
        what_if_rows([load_study(storage_url, "a")], ["b200"])
    study.set_user_attr("hardware", {"gpu_name": "NVIDIA B200"})
    with pytest.raises(InputError, match="not in the simulator's GPU catalog"):
        what_if_rows([load_study(storage_url, "a")], ["h100-80g"])


def test_a_study_without_a_feasible_trial_still_gets_a_column(storage_url: str) -> None:
    build_study(storage_url, "a")
    optuna.create_study(study_name="empty", storage=storage_url)
    rows = compare_rows([load_study(storage_url, "a"), load_study(storage_url, "empty")])
    assert rows[1].trial is None
    assert rows[1].best_config == "(no feasible trial yet)"
    assert rows[1].source == "measured: 0 trials, none feasible"


def test_a_study_run_elsewhere_finds_its_workload_through_its_run_options(
    storage_url: str,
) -> None:
    """`autotune run --workload sample.jsonl` stores the path as given (relative to where
    it ran); compare, run from elsewhere, takes the absolute one the run options kept."""
    build_study(storage_url, "a")
    on_the_catalog_gpu(storage_url, "a")
    study = optuna.load_study(study_name="a", storage=storage_url)
    workload = study.user_attrs["workload"]
    study.set_user_attr("workload", {**workload, "path": "elsewhere/sample-claudecode.jsonl"})
    with pytest.raises(InputError, match="is gone"):
        study_plan(load_study(storage_url, "a"))
    study.set_user_attr("run_options", {"workload": workload["path"]})
    plan, _ = study_plan(load_study(storage_url, "a"))
    assert plan.digest == workload["digest"]
