"""The residual model and the crown: learning where the simulator is wrong, noise handled."""

from __future__ import annotations

import numpy as np

from autotune.tuner.confirm import crown
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
