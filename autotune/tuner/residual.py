"""What the simulator gets wrong, learned from the trials measured so far.

The residual r = measured utility - predicted utility (a log ratio) is
modelled as a Bayesian linear function of the config's coordinates: a prior
centred on zero (the simulator is right), a noise term for run-to-run spread.
Its posterior mean re-ranks the lattice; its posterior spread is large where
nothing similar was measured, so an upper-confidence pick leaves the seeded
region once the measurements there fall short of the predictions.
"""

from __future__ import annotations

import numpy as np

PRIOR_BIAS_SD = 0.3  # a whole-landscape offset of +-30% is plausible
PRIOR_SLOPE_SD = 0.15  # a trend along one coordinate of +-15% across its range
NOISE_SD = 0.04  # 3% run-to-run noise plus what a linear trend cannot say


class ResidualModel:
    """Posterior of the residual given (coordinates, residual) pairs."""

    def __init__(self, coords: np.ndarray, residuals: np.ndarray) -> None:
        features = _features(coords)
        dim = features.shape[1]
        prior = np.full(dim, PRIOR_SLOPE_SD**-2)
        prior[0] = PRIOR_BIAS_SD**-2
        precision = np.diag(prior) + features.T @ features / NOISE_SD**2
        self._cov = np.linalg.inv(precision)
        self._mean = self._cov @ features.T @ residuals / NOISE_SD**2
        self.count = len(residuals)
        fitted = features @ self._mean
        self.misfit = float(np.sqrt(np.mean((residuals - fitted) ** 2))) if len(residuals) else 0.0

    def predict(self, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of the residual at each row of ``coords``."""
        features = _features(coords)
        mean = features @ self._mean
        var = np.einsum("ij,jk,ik->i", features, self._cov, features)
        return mean, np.sqrt(np.maximum(var, 0.0))


def _features(coords: np.ndarray) -> np.ndarray:
    coords = np.atleast_2d(coords)
    return np.hstack([np.ones((coords.shape[0], 1)), coords])
