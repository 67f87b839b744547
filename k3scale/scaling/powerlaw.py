"""Pure power laws by (weighted) linear regression in log space: y = k * prod_j x_j^c_j.

Used for N_opt(C) and D_opt(C) from IsoFLOP minima (Chinchilla Approach 2; Porian et al. 2024
weight by 1/var(log N*)) and for hyper-parameter laws lr_opt(C), batch_opt(C) (DeepSeek LLM 2024)
or lr_opt(N, D) (StepLaw, Li et al. 2025).
"""

from __future__ import annotations

import numpy as np

from k3scale.errors import K3ScaleError
from k3scale.scaling import checks
from k3scale.scaling.bootstrap import run_bootstrap
from k3scale.scaling.result import FitResult


def _solve(log_x: np.ndarray, log_y: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Weighted least squares of log_y on [1, log_x]; returns [1 + J] coefficients."""
    design = np.column_stack([np.ones(len(log_y)), log_x])
    w = np.ones(len(log_y)) if weights is None else weights
    sqrt_w = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(design * sqrt_w[:, None], log_y * sqrt_w, rcond=None)
    return coef


def _refit(log_x: np.ndarray, log_y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    if np.linalg.matrix_rank(np.column_stack([np.ones(len(log_y)), log_x])) < log_x.shape[1] + 1:
        return np.full(log_x.shape[1] + 1, np.nan)
    return _solve(log_x, log_y, weights)


def fit_power_law(
    inputs: dict[str, np.ndarray],
    output,
    *,
    weights=None,
    num_resamples: int = 0,
    seed: int = 0,
    workers: int = 1,
    target: str,
    units: dict[str, str],
) -> FitResult:
    """Fit log y = log k + sum_j c_j log x_j by (weighted) least squares.

    Args:
        inputs: name -> [n] positive regressors (e.g. {"C": compute} or {"N": n, "D": d}).
        output: [n] positive response (e.g. n_opt, lr_opt).
        weights: optional [n] regression weights (e.g. 1 / var(log y)).
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
    w = np.ones(len(y)) if weights is None else checks.positive_finite("weights", weights)
    if np.linalg.matrix_rank(np.column_stack([np.ones(len(y)), log_x])) < len(cols) + 1:
        raise K3ScaleError(
            f"power-law fit: regressors {list(cols)} do not vary enough (one size or one budget?);"
            " add points that differ in each regressor"
        )
    coef = _solve(log_x, np.log(y), w)
    resid = np.log(y) - np.column_stack([np.ones(len(y)), log_x]) @ coef
    mean = np.average(np.log(y), weights=w)
    r2 = 1 - np.sum(w * resid**2) / np.sum(w * (np.log(y) - mean) ** 2)
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
            "weighted": weights is not None,
            "objective": "least squares on log y",
        },
    )
    if num_resamples <= 0:
        return result
    draws = run_bootstrap(
        _refit,
        [log_x, np.log(y), w],
        names,
        num_resamples=num_resamples,
        seed=seed,
        workers=workers,
        unit="points",
    )
    intervals = draws.intervals()
    intervals["k"] = [float(np.exp(v)) for v in intervals["log_k"]]
    return result.replace(intervals=intervals, extra={**result.extra, "bootstrap": draws.summary()})
