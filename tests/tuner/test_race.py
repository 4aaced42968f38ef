"""Racing the top candidates: re-measure where it most raises the crown's expected value."""

from __future__ import annotations

import numpy as np

from autotune.config.trial_config import TrialConfig
from autotune.tuner.confirm import Belief, crown, exploration_gain, race
from autotune.tuner.guide import Guide
from autotune.tuner.lattice import Candidate
from autotune.tuner.measured import MeasuredIndex
from autotune.tuner.sampler import GuidedSampler


def measured(runs: list[tuple[str, float]]) -> MeasuredIndex:
    index = MeasuredIndex()
    for trial, (key, value) in enumerate(runs):
        index.add(
            key, params={"k": key}, trial=trial, values=[value], constraints={}, measured=True
        )
    return index


def test_a_measurement_is_worth_more_for_a_close_and_less_measured_config() -> None:
    once, often = Belief(0.0, 0.03**2), Belief(0.0, 0.03**2 / 6)
    assert once.gain(0.01) > often.gain(0.01)  # one more run moves a single run's mean more
    assert once.gain(0.01) > once.gain(0.08)  # and matters only if the crown can change
    assert once.gain(0.08) < 0.001


def test_race_re_measures_the_contenders_not_a_config_far_behind() -> None:
    # a and b 1% apart, a measured three times; c 20% behind, measured once.
    index = measured([("a", 101.0), ("a", 101.0), ("a", 101.0), ("b", 100.0), ("c", 80.0)])
    assert race(index, maximize=True).key == "b"
    for trial in range(5, 10):  # b now measured as often as a, and still 1% behind
        index.add(
            "b", params={"k": "b"}, trial=trial, values=[100.0], constraints={}, measured=True
        )
    assert race(index, maximize=True).key == "a"  # the less measured of the two
    assert race(measured([("a", 100.0)]), maximize=True).key == "a"  # alone: measure it again


def _guide(utilities: list[float]) -> Guide:
    """Candidates a, b, c ... at one point of the space: the residual is one offset."""
    config = TrialConfig(model="m")
    candidates = [Candidate({"k": k}, config, k) for k in "abcd"[: len(utilities)]]
    coords = np.zeros((len(utilities), 1))
    return Guide(candidates, np.array(utilities), coords, encode=lambda p: coords[0])


def test_the_crown_can_ignore_the_simulator_prior() -> None:
    # The simulator predicts b 10% better than a; one run each, a measured 3% higher.
    guide = _guide([np.log(100.0), np.log(110.0), np.log(50.0)])
    index = measured([("a", 103.0), ("b", 100.0)])
    sampler = GuidedSampler(guide, index, {}, learn=True)
    assert crown(index, maximize=True, sampler=sampler).key == "b"  # the prior tips it
    assert crown(index, maximize=True, sampler=sampler, prior=False).key == "a"


def test_exploring_is_worth_little_when_nothing_unmeasured_can_beat_the_leader() -> None:
    index = measured([("a", 100.0), ("b", 99.0)])
    hopeless = GuidedSampler(_guide([np.log(100.0), np.log(99.0), np.log(50.0)]), index, {})
    promising = GuidedSampler(_guide([np.log(100.0), np.log(99.0), np.log(104.0)]), index, {})
    leader = np.log(100.0)
    assert exploration_gain(index, hopeless, leader, maximize=True) < 1e-3
    assert exploration_gain(index, promising, leader, maximize=True) > 0.01


def test_a_neighbour_s_one_lucky_run_does_not_outrank_a_config_measured_often() -> None:
    # a and b measured six times each, b 1.5% ahead; n, a neighbour the local search
    # launched around a, measured once 2.5% above a: within one run's noise of a.
    index = measured([("a", 60.0)] * 6 + [("b", 60.9)] * 6)
    index.add(
        "n", params={"k": "n"}, trial=12, values=[61.5], constraints={}, measured=True, centre=0
    )
    assert crown(index, maximize=True, prior=False).key == "b"  # n is believed nearer a
    for trial in range(13, 17):  # four more runs at 61.5: now the evidence is n's own
        index.add("n", params={"k": "n"}, trial=trial, values=[61.5], constraints={}, measured=True)
    assert crown(index, maximize=True, prior=False).key == "n"
    plain = measured([("a", 60.0)] * 6 + [("b", 60.9)] * 6 + [("n", 61.5)])
    assert crown(plain, maximize=True, prior=False).key == "b"  # a lattice config's one run
    plain.add("n", params={"k": "n"}, trial=13, values=[61.5], constraints={}, measured=True)
    assert crown(plain, maximize=True, prior=False).key == "n"  # ... and its second
