"""The published measurements file: it loads, and bad data is one line naming the file,
the point's line and id, and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.calibration.published import PUBLISHED_FILE, load_published
from autotune.calibration.published_predict import CATALOG_MODEL, NotPredicted, sim_config
from autotune.errors import InputError

GOOD = """\
- id: a
  source_url: https://github.com/owner/repo/blob/abc/results/run.json
  vllm_version: 0.11.0
  gpu: h100-80g
  tensor_parallel: 1
  model: Qwen/Qwen3-8B
  precision: bf16
  benchmark: {tool: vllm bench serve, dataset: random, input_len: 1024, output_len: 128,
    num_prompts: 100, max_concurrency: 8, request_rate: inf, ignore_eos: true}
  figures: {output_throughput_tok_s: 1000.0, median_tpot_ms: 7.5, median_ttft_ms: 40.0}
"""


def test_the_stored_file_has_the_published_runs_the_table_needs() -> None:
    points = load_published(PUBLISHED_FILE)
    assert len(points) >= 40
    assert len({point.source for point in points}) >= 6
    predictable = [point for point in points if point.model in CATALOG_MODEL]
    assert len(predictable) >= 40 and all(p.figures.model_dump(exclude_none=True) for p in points)


def test_a_bad_point_names_file_line_id_and_field(tmp_path: Path) -> None:
    path = tmp_path / "runs.yaml"
    bad = GOOD.replace("id: a", "id: b").replace("request_rate: inf", "request_rate: fast")
    path.write_text(GOOD + bad)
    with pytest.raises(InputError) as caught:
        load_published(path)
    assert str(caught.value) == (
        f"{path}:11: point b: benchmark.request_rate: "
        "Input should be a valid number, unable to parse string as a number"
    )
    path.write_text(GOOD + GOOD)
    with pytest.raises(InputError, match=r"runs\.yaml:11: point a: id: used by an earlier point"):
        load_published(path)
    path.write_text(
        GOOD.replace("  source_url: https://github.com/owner/repo/blob/abc/results/run.json\n", "")
    )
    with pytest.raises(
        InputError, match=r"runs\.yaml:1: point a: \(point\): Value error, a point needs"
    ):
        load_published(path)
    path.write_text("- [unclosed")
    with pytest.raises(InputError, match=r"runs\.yaml: cannot read the published points"):
        load_published(path)


def test_a_publication_is_its_repository_or_its_thread_or_its_site(tmp_path: Path) -> None:
    path = tmp_path / "runs.yaml"
    urls = [
        "https://github.com/owner/repo/blob/abc/results/run.json",
        "https://github.com/vllm-project/vllm/issues/16515#issuecomment-1",
        "https://example.dev/blog/post/",
    ]
    path.write_text("".join(GOOD.replace("id: a", f"id: p{i}").replace(
        "https://github.com/owner/repo/blob/abc/results/run.json", url
    ) for i, url in enumerate(urls)))  # fmt: skip
    sources = [point.source for point in load_published(path)]
    assert sources == ["github.com/owner/repo", "github.com/vllm-project/vllm/issues/16515",
                       "example.dev"]  # fmt: skip


def test_a_point_the_simulator_cannot_stand_for_says_why(tmp_path: Path) -> None:
    path = tmp_path / "runs.yaml"
    path.write_text(GOOD.replace("Qwen/Qwen3-8B", "acme/Unknown-7B"))
    with pytest.raises(NotPredicted, match="model acme/Unknown-7B is not in the simulator"):
        sim_config(load_published(path)[0])
    path.write_text(GOOD.replace("Qwen/Qwen3-8B", "meta-llama/Llama-3.1-70B-Instruct"))
    with pytest.raises(NotPredicted, match="does not start on h100-80g x1"):
        sim_config(load_published(path)[0])  # 131 GiB of weights on one 80 GB card
