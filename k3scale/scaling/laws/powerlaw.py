"""Pure power laws by linear regression in log space: y = k * prod_j x_j^c_j.

Used for N_opt(C) and D_opt(C) from IsoFLOP minima (Chinchilla Approach 2) and for
hyper-parameter laws lr_opt(C), batch_opt(C) (DeepSeek LLM 2024) or lr_opt(N, D) (StepLaw,
Li et al. 2025). Unweighted: Porian et al. 2024 weight by 1/var(log N*), but no caller here
has those variances.
"""

from __future__ import annotations

import numpy as np

from k3scale.errors import K3ScaleError
from k3scale.scaling.laws.bootstrap import run_bootstrap
from k3scale.scaling.values import checks
from k3scale.scaling.values.result import FitResult


def _design(log_x: np.ndarray) -> np.ndarray:
    """[n, 1 + J] regressors: a column of ones, then log x."""
    return np.column_stack([np.ones(len(log_x)), log_x])


def _refit(log_x: np.ndarray, log_y: np.ndarray) -> np.ndarray:
    """Least-squares [1 + J] coefficients of log_y on [1, log_x]; NaN when they are not
    identified (a resample with one distinct value of a regressor)."""
    design = _design(log_x)
    if np.linalg.matrix_rank(design) < design.shape[1]:
        return np.full(design.shape[1], np.nan)
    return np.linalg.lstsq(design, log_y, rcond=None)[0]


def fit_power_law(
    inputs: dict[str, np.ndarray],
    output,
    *,
    num_resamples: int = 0,
    seed: int = 0,
    workers: int = 1,
    target: str,
    units: dict[str, str],
) -> FitResult:
    """Fit log y = log k + sum_j c_j log x_j by least squares.

    Args:
        inputs: name -> [n] positive regressors (e.g. {"C": compute} or {"N": n, "D": d}).
        output: [n] positive response (e.g. n_opt, lr_opt).
        num_resamples, seed, workers: bootstrap over points.
        target, units: recorded on the result.

    Returns:
        FitResult with params {"k", "exp_<name>"...}, derived {"log_k"}; R^2 in extra.
    """
    y = checks.positive_finite("output", output, "power-law fit")
    cols = {name: checks.positive_finite(name, x, "power-law fit") for name, x in inputs.items()}
    checks.same_length("power-law fit", output=y, **cols)
    checks.enough_points(
        len(y), len(cols) + 1, f"a power law in {', '.join(cols)}", "power-law fit"
    )
    log_x = np.column_stack([np.log(x) for x in cols.values()])
    log_y = np.log(y)
    coef = _refit(log_x, log_y)
    if not np.all(np.isfinite(coef)):
        raise K3ScaleError(
            f"power-law fit: regressors {list(cols)} do not vary enough (one size or one budget?);"
            " add points that differ in each regressor"
        )
    resid = log_y - _design(log_x) @ coef
    r2 = 1 - np.sum(resid**2) / np.sum((log_y - log_y.mean()) ** 2)
    names = ["log_k", *(f"exp_{n}" for n in cols)]
    params = {
        "k": float(np.exp(coef[0])),
        **{n: float(v) for n, v in zip(names[1:], coef[1:], strict=True)},
    }
    result = FitResult(
        target=target,
        units=units,
        params=params,
        success=True,
        message="",
        n_points=len(y),
        derived={"log_k": float(coef[0])},
        extra={
            "r2": float(r2),
            "objective": "least squares on log y",
        },
    )
    if num_resamples <= 0:
        return result
    draws = run_bootstrap(
        _refit,
        [log_x, log_y],
        names,
        num_resamples=num_resamples,
        seed=seed,
        workers=workers,
        unit="points",
    )
    intervals = draws.intervals()
    intervals["k"] = [float(np.exp(v)) for v in intervals["log_k"]]
    return result.replace(intervals=intervals, extra={**result.extra, "bootstrap": draws.summary()})
