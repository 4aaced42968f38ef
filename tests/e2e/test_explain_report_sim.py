"""What `explain` and `report` say of a real study on the simulator: figures that add up,
trials placed where they ran."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from autotune.results.reader import load_study
from autotune.results.report import report_figures
from tests.e2e.conftest import REPO, SAMPLE_WORKLOAD, autotune_argv, autotune_in_process, tuner_args

LMCACHE_SPACE = REPO / "tests" / "e2e" / "data" / "refine-longctx.yaml"  # 3 GiB KV, LMCache
DEDUP_SPACE = REPO / "tests" / "e2e" / "data" / "tuner-dedup.yaml"  # 2N-1 batched tokens


def run(
    tmp_path: Path, space: Path, *extra: str, sampler: str = "grid", settings: dict | None = None
) -> str:
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    args = [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(space),
        "--storage", storage, "--study", "s", "--sampler", sampler, *extra,
        *tuner_args(tmp_path / "settings", {"seed": 1, "confirm": 0,
                                            "simulator": {"time_scale": 200}}, settings or {}),
    ]  # fmt: skip
    done = subprocess.run(
        autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return storage


@pytest.mark.timeout(240)
def test_explain_gives_the_prefix_cache_s_two_tiers_as_shares_that_add_up(tmp_path: Path) -> None:
    """Before: "served 80% of prompt tokens, plus 25% from the external tier": vLLM's external
    rate is over the tokens the GPU missed, so the two added up to 105%. (The space's
    baseline, its 3 GiB pool too small for eight sessions' prefixes: both tiers serve.)"""
    storage = run(
        tmp_path, LMCACHE_SPACE, "--trials", "1", "--concurrency", "8",
        sampler="guided", settings={"warm_start": 0},
    )  # fmt: skip
    stats = load_study(storage, "s").trials[0].server_stats
    assert stats is not None and stats.external_prefix_cache_hits  # both tiers served some
    assert stats.prefix_cache_hit_rate + stats.external_prefix_cache_hit_rate > 1  # type: ignore[operator]
    assert stats.prefix_cache_queries is not None
    gpu = stats.prefix_cache_hits / stats.prefix_cache_queries  # type: ignore[operator]
    external = stats.external_prefix_cache_hits / stats.prefix_cache_queries
    explained = autotune_in_process("explain", "--storage", storage, "--study", "s", columns=400)
    assert explained.returncode == 0, explained.stderr
    said = re.search(
        r"served (\d+)% of prompt tokens: (\d+)% from GPU memory and (\d+)% from the external",
        explained.stdout,
    )
    assert said, explained.stdout
    total, gpu_pct, external_pct = (int(group) for group in said.groups())
    assert total == gpu_pct + external_pct <= 100
    assert gpu_pct == round(100 * gpu) and external_pct == round(100 * external)


@pytest.mark.timeout(240)
def test_the_report_s_slice_plot_places_trials_at_the_batched_tokens_they_launched(
    tmp_path: Path,
) -> None:
    """Before: a trial whose 2N-1 rule launched 1,599 batched tokens sat at its searched 8,192."""
    storage = run(
        tmp_path, DEDUP_SPACE, "--trials", "6", "--concurrency", "4",
        settings={"dedup": False, "load": {"max_requests": 8}},
    )  # fmt: skip
    loaded = load_study(storage, "s")
    measured = [row for row in loaded.feasible_measured() if row.values]
    launched = sorted(int(row.flags["max-num-batched-tokens"]) for row in measured)
    searched = sorted(int(row.params["max_num_batched_tokens"]) for row in measured)
    assert launched != searched  # the rule replaced some (the premise)
    slices = [f for f in report_figures(loaded) if "Slice" in (f.layout.title.text or "")]
    assert len(slices) == 1
    axis = next(
        name[1:].replace("axis", "")
        for name in slices[0].layout
        if name.startswith("xaxis")
        and slices[0].layout[name].title.text == "max_num_batched_tokens"
    )
    (trace,) = [t for t in slices[0].data if (t.xaxis or "x") == f"x{axis}" and t.x is not None]
    assert sorted(int(x) for x in trace.x) == launched
