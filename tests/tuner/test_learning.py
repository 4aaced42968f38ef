"""The residual model and the crown: learning where the simulator is wrong, noise handled."""

from __future__ import annotations

import numpy as np

from autotune.tuner.confirm import crown, duel
from autotune.tuner.measured import MeasuredIndex
from autotune.tuner.residual import ResidualModel


def test_the_residual_model_learns_a_trend_and_is_unsure_far_from_data() -> None:
    coords = np.array([[1.0, 0.0], [0.9, 0.1], [0.8, 0.0]])  # measured where x0 is high
    residuals = np.array([-0.3, -0.27, -0.24])  # the simulator overpredicts there
    model = ResidualModel(coords, residuals)
    mean, spread = model.predict(np.array([[1.0, 0.0], [0.0, 1.0]]))
    assert mean[0] < -0.2  # near the data: the measured shortfall
    assert mean[1] > mean[0]  # far away: less of it
    assert spread[1] > spread[0]


def test_without_a_model_the_crown_is_the_best_mean_of_feasible_configs() -> None:
    index = MeasuredIndex()
    ok = {"oom": -0.1, "crash": -1.0}
    index.add("a", params={}, trial=0, values=[100.0], constraints=ok, measured=True)
    index.add("b", params={}, trial=1, values=[104.0], constraints=ok, measured=True)
    index.add("c", params={}, trial=2, values=[200.0], constraints={"oom": 0.5}, measured=True)
    assert crown(index, maximize=True).key == "b"
    index.add("b", params={}, trial=3, values=[94.0], constraints=ok, measured=True)  # re-measured
    winner = crown(index, maximize=True)
    assert winner.key == "a"  # b's mean is 99: its first run was luck
    assert index.get("b").spread > 0 and index.get("b").trials == [1, 3]


def test_the_tail_re_measures_the_less_measured_of_a_close_leader_and_challenger() -> None:
    index = MeasuredIndex()
    for trial, (key, value) in enumerate([("a", 100.0), ("a", 101.0), ("b", 100.5), ("c", 60.0)]):
        index.add(
            key, params={"k": key}, trial=trial, values=[value], constraints={}, measured=True
        )
    assert duel(index, maximize=True).key == "b"  # 0.5% behind a, measured once
    index.add("b", params={"k": "b"}, trial=4, values=[100.5], constraints={}, measured=True)
    index.add("b", params={"k": "b"}, trial=5, values=[100.5], constraints={}, measured=True)
    assert duel(index, maximize=True).key == "a"  # now a is the less measured of the two
    far = MeasuredIndex()
    for trial, (key, value) in enumerate([("a", 100.0), ("a", 100.0), ("c", 60.0)]):
        far.add(key, params={"k": key}, trial=trial, values=[value], constraints={}, measured=True)
    assert duel(far, maximize=True) is None  # 40% behind: not worth a launch
