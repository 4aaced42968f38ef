"""The catalog's per-GPU summary of the public fidelity table (what `compare --what-if` and
`plan` print beside a GPU) is what scripts/bench_published.py computes from the stored
measurements and the simulator as it is: rerun `python scripts/bench_published.py --write`
when either changes."""

from __future__ import annotations

import pytest

from autotune.calibration.published import load_published
from autotune.calibration.published_table import predict_all, scored, summary_rows
from autotune.catalog.provenance import published_summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_catalog_summary_is_the_tables_own() -> None:
    computed = summary_rows(scored(predict_all(load_published())))
    stored = published_summary()
    assert sorted(stored) == sorted(computed)
    for gpu, row in computed.items():
        for key, value in row.items():
            want = stored[gpu][key]
            if isinstance(value, float):
                assert want == pytest.approx(value, abs=0.0015), (gpu, key)
            else:
                assert want == value, (gpu, key)


def test_each_gpu_says_where_its_speed_comes_from_and_how_it_fared() -> None:
    from autotune.catalog.provenance import provenance_line

    summary = published_summary()
    checked = next(iter(summary))
    row = summary[checked]
    line = provenance_line(checked)
    error = row["throughput_median_error"]
    assert line.startswith(f"{checked}: median error {error:.0%} throughput")
    assert f"on {row['points']} published run" in line and "; constants: " in line
    assert provenance_line("rtx4080s-32g").startswith(
        "rtx4080s-32g: no published run checked; constants: "
    )
