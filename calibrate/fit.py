"""Non-negative linear fit of step time over the StepPlan features, by relative error.

``select_fit`` fits the base features and, for a few knees, the base plus the piecewise
``tokens_over_knee`` term; leave-one-out cross-validation picks the knee only when it pays
(held-out error at least ``KNEE_GAIN`` lower), and reports the chosen fit's held-out error
per region of the grid.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from sim.cost.features import FEATURES

KNEE_INDEX = FEATURES.index("tokens_over_knee")
KNEE_CANDIDATES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
KNEE_GAIN = 0.9  # the knee must cut the cross-validated error to 90% of the base fit's or less


def fit_nonnegative(x: np.ndarray, y: np.ndarray, relative: bool = True) -> np.ndarray:
    """Coefficients c >= 0 minimising the sum of squared *relative* errors of x @ c against y.

    Relative, because step times span 5 ms to 500 ms and each matters in proportion
    (``relative=False``: plain least squares). Columns are scaled to unit norm first so NNLS
    converges on features of wildly different magnitudes (a constant next to sums of
    millions of context tokens).
    """
    w = 1.0 / y if relative else np.ones_like(y)
    xw = x * w[:, None]
    scale = np.linalg.norm(xw, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(xw / scale, y * w, maxiter=50 * x.shape[1])
    return coef / scale


def relative_errors(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> np.ndarray:
    return (x @ coef - y) / y


def coefficients_dict(coef: np.ndarray) -> dict[str, float]:
    return {name: float(value) for name, value in zip(FEATURES, coef, strict=True)}


def design(points: list[dict], knee: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Feature matrix (the knee column recomputed for ``knee``; 0 without one) and step times."""
    x = np.array([p["features"] for p in points], dtype=float)
    tokens = np.array([sum(n for n, _ in p["prefill"]) + p["decode_batch"] for p in points], dtype=float)
    x[:, KNEE_INDEX] = np.maximum(0.0, tokens - knee) if knee is not None else 0.0
    y = np.array([p["median_s"] for p in points], dtype=float)
    return x, y


def loo_errors(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Leave-one-out relative error of each point, predicted by a fit without it."""
    n = len(y)
    out = np.empty(n)
    mask = np.ones(n, dtype=bool)
    for i in range(n):
        mask[i] = False
        coef = fit_nonnegative(x[mask], y[mask])
        out[i] = (x[i] @ coef - y[i]) / y[i]
        mask[i] = True
    return out


def region_errors(errors: np.ndarray, regions: list[str]) -> dict[str, dict]:
    out = {}
    names = sorted(set(regions)) + ["all"]
    regions_arr = np.array(regions)
    for name in names:
        sel = np.ones(len(errors), bool) if name == "all" else regions_arr == name
        e = np.abs(errors[sel])
        out[name] = {"points": int(sel.sum()), "mean_abs_rel_error": float(e.mean()),
                     "p90_abs_rel_error": float(np.percentile(e, 90)), "max_abs_rel_error": float(e.max())}
    return out


def select_fit(points: list[dict]) -> dict:
    """The base fit, or base + knee when cross-validation says the knee pays; with its errors."""
    regions = [p["region"] for p in points]
    tokens = [sum(n for n, _ in p["prefill"]) + p["decode_batch"] for p in points]
    # A knee needs a few points on each side to be estimated at all.
    knees = [k for k in KNEE_CANDIDATES
             if sum(t > k for t in tokens) >= 3 and sum(t <= k for t in tokens) >= 3]
    candidates = {}
    for knee in [None, *knees]:
        x, y = design(points, knee)
        cv = loo_errors(x, y) if len(y) > x.shape[1] + 1 else relative_errors(x, y, fit_nonnegative(x, y))
        candidates[knee] = float(np.mean(np.abs(cv))), cv
    base_err = candidates[None][0]
    best = min(candidates, key=lambda k: candidates[k][0])
    chosen = best if best is not None and candidates[best][0] <= KNEE_GAIN * base_err else None
    x, y = design(points, chosen)
    coef = fit_nonnegative(x, y)
    fitted = relative_errors(x, y, coef)
    return {
        "coefficients": coef,
        "knee_tokens": chosen,
        "cv": region_errors(candidates[chosen][1], regions),
        "in_sample": region_errors(fitted, regions),
        "candidates": {("none" if k is None else str(k)): round(v[0], 5) for k, v in candidates.items()},
        "predicted_s": (x @ coef).tolist(),
        "cv_rel_errors": candidates[chosen][1].tolist(),
    }
