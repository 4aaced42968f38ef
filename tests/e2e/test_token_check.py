"""Planned vs served prompt tokens, checked against the simulator's own usage counts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace

import pytest

from autotune.replay.load import LoadSpec
from autotune.replay.runner import replay
from autotune.workload.expand import expand
from autotune.workload.gen import fixed
from tests.e2e.conftest import start_sims

pytestmark = [pytest.mark.timeout(120)]

LOAD = LoadSpec(mode="concurrency", concurrency=4, saturation_stop=False)


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for start in start_sims(tmp_path_factory.mktemp("sim")):
        yield start(50.0)


def _replay(url: str, plan):
    coro = replay(url=url, plan=plan, load=LOAD, model_name="", server_time_scale=50.0)
    return asyncio.run(coro).stats.prompt_tokens_check


def test_prompts_in_the_servers_token_space_pass_with_the_template_measured(sim_url: str) -> None:
    check = _replay(sim_url, expand(fixed(requests=10, prompt_tokens=120, output_tokens=4)))
    assert check is not None and check.ok, check
    assert check.checked == 8
    # The simulator's ChatML-like template: 3 tokens a message, 2 to start the answer.
    assert check.template_tokens == 8 * (3 + 2)
    assert check.served_tokens == check.planned_tokens == 8 * (120 + 5)


def test_prompts_the_plan_miscounts_are_reported_in_plain_words(sim_url: str) -> None:
    # A plan whose counts are not the served model's: it says 60 tokens where it sends 120
    # words (what a plan in the wrong tokenizer does).
    plan = expand(fixed(requests=10, prompt_tokens=120, output_tokens=4))
    halved = tuple(replace(r, prompt_tokens=r.prompt_tokens // 2) for r in plan.requests)
    check = _replay(sim_url, replace(plan, requests=halved))
    assert check is not None and not check.ok
    assert check.mismatched == 8
    assert check.served_tokens == 8 * 125 and check.planned_tokens == 8 * 65
    assert "differ by more than 1%" in check.message
    assert "'words'" in check.message  # the plan's token space is named
