"""`autotune compare --what-if` on a real study: the space tuned anew for the other GPU."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from autotune.results.reader import load_study
from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD, autotune_argv, autotune_in_process, tuner_args

SPACE = REPO / "tests" / "results" / "data" / "what-if.yaml"  # KV 6-13 GiB on a 32 GB card


def _cells(table: str, label: str) -> list[str]:
    """The cells of the rich table's row ``label``, one per column, wrapped lines joined."""
    rows = re.split(r"\n[├└┡]", table)
    row = next(r for r in rows if re.search(rf"│ {re.escape(label)}\s+│", r))
    lines = [line.split("│")[2:-1] for line in row.splitlines() if line.startswith("│")]
    columns = zip(*lines, strict=True)
    return [" ".join(part.strip() for part in column).strip() for column in columns]


@pytest.mark.timeout(300)
def test_what_if_tunes_the_space_for_the_other_gpu_and_shows_the_config_it_picked(
    tmp_path: Path,
) -> None:
    """Before: the H200 column ran the 32 GB card's winner (at most 13 GiB of KV on a
    141 GB card), understating the H200 several times over."""
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    args = [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(SPACE),
        "--storage", storage, "--study", "s", "--trials", "3",
        *tuner_args(tmp_path / "settings", {"seed": 1, "load": {"max_requests": 24},
                                            "simulator": {"time_scale": 200}}),
    ]  # fmt: skip
    done = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    best = load_study(storage, "s").best()
    compared = autotune_in_process(
        "compare", "s", "--storage", storage, "--what-if", "h200-141g",
        "--price", "rtx4080s-32g=0.35", "--price", "h200-141g=3.50", columns=200,
    )  # fmt: skip
    assert compared.returncode == 0, compared.stdout + compared.stderr
    text = compared.stdout
    measured, what_if = _cells(text, "best config")
    assert what_if != measured
    kv = re.search(r"kv-cache-memory-bytes=([\d.]+) GiB", what_if)
    assert kv and float(kv[1]) > 13.0, what_if  # past the space's 32 GB ceiling
    assert f"{best.flags['kv-cache-memory-bytes'] / (1 << 30):g} GiB" in measured
    source = _cells(text, "source")[1]
    assert source.startswith("predicted: tuned for h200-141g on the simulator"), source
    assert "calibrated on rtx4080s-32g" in source
    tok_s = [float(cell.replace(",", "")) for cell in _cells(text, "output tok/s")]
    assert tok_s[1] > 2 * tok_s[0]
    assert "h200-141g: tuning 's''s space on the simulator" in text  # what it is doing
