"""What a workload's schedule offers an instant server, and when measured configs tie."""

from __future__ import annotations

import pytest

from autotune.replay.load import LoadSpec
from autotune.results.load_bound import find_tie, offered_output_tok_s, tie_sentences
from autotune.results.reader import load_study
from tests.replay.conftest import make_plan
from tests.results.conftest import Point, build_study


def test_the_offered_load_is_the_schedule_with_every_answer_instant() -> None:
    # Two sessions of three turns, 10 s apart: answered at once, 6 x 8 tokens over 20 s.
    plan = make_plan(sessions=2, turns=3, gap_s=10.0, output_tokens=8)
    sessions = LoadSpec(mode="sessions", concurrency=2)
    assert offered_output_tok_s(plan, sessions) == pytest.approx(6 * 8 / 20.0)
    # One session at a time: the second starts when the first ends, 40 s in all.
    assert offered_output_tok_s(plan, LoadSpec(mode="sessions", concurrency=1)) == (
        pytest.approx(6 * 8 / 40.0)
    )
    # A closed loop without gaps sends its next request at once: the load sets no bound.
    assert offered_output_tok_s(plan, LoadSpec(mode="concurrency", concurrency=2)) is None


def test_configs_far_apart_do_not_tie_and_close_ones_do(storage_url: str) -> None:
    build_study(storage_url, "apart")  # 90 to 600 tok/s: the field notes' landscape
    assert find_tie(load_study(storage_url, "apart"), offered_tok_s=None) is None
    # Three KV pools, each holding the 8 sequences allowed: the same figures.
    close = [
        Point(6.0, "auto", 8, 0, baseline=True),
        Point(7.0, "auto", 8, 0),
        Point(8.0, "auto", 8, 0),
    ]
    build_study(storage_url, "close", points=close)
    loaded = load_study(storage_url, "close")
    tie = find_tie(loaded, offered_tok_s=None)
    assert tie is not None and tie.configs == 3 and not tie.load_bound
    assert tie_sentences(tie)[0].startswith("The configs tie: all 3 configs measured served")
    bound = find_tie(loaded, offered_tok_s=tie.high_tok_s * 1.05)
    assert bound is not None and bound.load_bound
    assert "The load, not the config, sets the throughput" in tie_sentences(bound)[0]
    assert not find_tie(loaded, offered_tok_s=tie.high_tok_s * 2).load_bound  # type: ignore[union-attr]


def test_configs_near_the_offered_load_tie_however_far_apart_single_runs_put_them(
    storage_url: str,
) -> None:
    """Before: a tie needed three configs within 3% of each other, so configs at the
    load's ceiling 8% apart (single runs at 31.5-34.7 tok/s against 34.6 offered) got a
    crowned winner and no word on the load."""
    build_study(storage_url, "apart")  # 220 to 608 tok/s; the two best 562 and 608
    loaded = load_study(storage_url, "apart")
    tie = find_tie(loaded, offered_tok_s=600.0)
    assert tie is not None and tie.load_bound
    assert (tie.configs, tie.measured) == (2, 8) and tie.spread > 0.07
    sentence = tie_sentences(tie)[0]
    assert sentence.startswith("The configs tie: 2 of the 8 configs measured served 562.0-608.0")
    assert "the workload offers 600.0 with an instant server (the best: 101% of it" in sentence
    assert find_tie(loaded, offered_tok_s=700.0) is None  # the best at 87%: room to gain
