from __future__ import annotations

import pytest
from rich.console import Console

from autotune.compare import compare_rows, comparison_table, parse_prices, price_for
from autotune.errors import InputError
from autotune.study_reader import load_study

from .conftest import build_study


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
