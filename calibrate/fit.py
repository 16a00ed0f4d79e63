"""Non-negative linear fit of step time over the StepPlan features, by relative error."""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from sim.cost.features import FEATURES


def fit_nonnegative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients c >= 0 minimising the sum of squared *relative* errors of x @ c against y.

    Relative, because step times span 5 ms to 500 ms and each matters in proportion.
    Columns are scaled to unit norm first so NNLS converges on features of wildly
    different magnitudes (a constant next to sums of millions of context tokens).
    """
    w = 1.0 / y
    xw = x * w[:, None]
    scale = np.linalg.norm(xw, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(xw / scale, np.ones_like(y), maxiter=50 * x.shape[1])
    return coef / scale


def relative_errors(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> np.ndarray:
    return (x @ coef - y) / y


def coefficients_dict(coef: np.ndarray) -> dict[str, float]:
    return {name: float(value) for name, value in zip(FEATURES, coef, strict=True)}
