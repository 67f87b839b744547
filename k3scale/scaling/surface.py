"""Chinchilla Approach 3: L(N, D) = E + A/N^alpha + B/D^beta with Epoch's protocol (methods.md 2.4).

Objective: summed Huber (delta = 1e-3) on log residuals, log-sum-exp parametrisation
`a = log A, b = log B, e = log E`, L-BFGS-B from every point of Epoch's 4,500-point grid, best
kept (Besiroglu et al. 2024, arXiv:2404.10102). A variable-projection fit (`fit_surface_vpnls`)
is the independent cross-check: linear in (E, A, B) for fixed (alpha, beta).
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.optimize import minimize, nnls

from k3scale.scaling import checks, verdict
from k3scale.scaling.bootstrap import run_bootstrap
from k3scale.scaling.objective import (
    HUBER_DELTA,
    LogPowerLaw,
    cartesian_grid,
    minimize_from_starts,
)
from k3scale.scaling.result import FitResult, failed

PARAM_NAMES = ("E", "A", "B", "alpha", "beta")
DERIVED_NAMES = ("a", "b", "G")
DEFAULT_UNITS = {"N": "parameters", "D": "tokens", "L": "nats/token", "C": "FLOPs"}
# C = 6 N D (Kaplan et al. 2020; Hoffmann et al. 2022): training FLOPs per parameter per token.
FLOPS_PER_PARAM_TOKEN = 6.0


def epoch_start_grid() -> np.ndarray:
    """Epoch's grid (arXiv:2404.10102 notebook), [4500, 5] in layout [a, b, alpha, beta, e].

    alpha, beta in {0, 0.5, ..., 2}; e in {-1, -0.5, ..., 1}; a, b in {0, 5, ..., 25}.
    """
    exps = np.arange(0.0, 2.01, 0.5)
    grid = cartesian_grid(
        exps, exps, np.arange(-1.0, 1.01, 0.5), np.arange(0.0, 26.0, 5.0), np.arange(0.0, 26.0, 5.0)
    )
    return grid[:, [3, 4, 0, 1, 2]]


def coarse_start_grid() -> np.ndarray:
    """A 72-point subset of Epoch's grid for tests that are not about the grid, [72, 5]."""
    grid = cartesian_grid(
        np.array([0.5, 1.0]),
        np.array([0.5, 1.0]),
        np.array([-0.5, 0.5]),
        np.array([0.0, 5.0, 10.0]),
        np.array([5.0, 10.0, 15.0]),
    )
    # Keep [a, b] rows in 2 x 3 = 6 combos per (alpha, beta, e): 2*2*2*3*3 = 72.
    return grid[:, [3, 4, 0, 1, 2]]


def params_from_theta(theta: np.ndarray) -> dict[str, float]:
    """[a, b, alpha, beta, e] -> {"E", "A", "B", "alpha", "beta"}."""
    return {
        "E": float(np.exp(theta[4])),
        "A": float(np.exp(theta[0])),
        "B": float(np.exp(theta[1])),
        "alpha": float(theta[2]),
        "beta": float(theta[3]),
    }


def allocation_exponents(params: dict[str, float]) -> dict[str, float]:
    """a = beta/(alpha+beta) (N* ~ C^a), b = alpha/(alpha+beta), G = (alpha A/(beta B))^(1/(a+b))."""
    # numpy scalars, not Python floats: a refit with alpha or beta <= 0, or a term that
    # underflowed to 0, gives NaN or inf (the bootstrap drops those draws), where Python would
    # raise ZeroDivisionError or return a complex number and fail the whole fit.
    alpha, beta, a_coef, b_coef = (np.float64(params[k]) for k in ("alpha", "beta", "A", "B"))
    total = alpha + beta
    with np.errstate(all="ignore"):
        g = (alpha * a_coef / (beta * b_coef)) ** (1.0 / total)
        return {"a": float(beta / total), "b": float(alpha / total), "G": float(g)}


def compute_optimal(
    params: dict[str, float], compute: np.ndarray, flops_per_token: float = FLOPS_PER_PARAM_TOKEN
) -> dict[str, np.ndarray]:
    """N*(C), D*(C) and L*(C) of a fitted surface (Hoffmann et al. 2022, eq. 4).

    Args:
        params: fitted {"E","A","B","alpha","beta"}.
        compute: [m] training FLOPs.
        flops_per_token: FLOPs per parameter per token (6 for C = 6ND).

    Returns:
        {"compute", "n_opt" (parameters), "d_opt" (tokens), "loss_opt", "tokens_per_param"}, each [m].
    """
    alloc = allocation_exponents(params)
    c = np.asarray(compute, dtype=np.float64) / flops_per_token
    n_opt = alloc["G"] * c ** alloc["a"]
    d_opt = c / n_opt
    loss = (
        params["E"] + params["A"] / n_opt ** params["alpha"] + params["B"] / d_opt ** params["beta"]
    )
    return {
        "compute": np.asarray(compute, dtype=np.float64),
        "n_opt": n_opt,
        "d_opt": d_opt,
        "loss_opt": loss,
        "tokens_per_param": d_opt / n_opt,
    }


def _objective(n: np.ndarray, d: np.ndarray, loss: np.ndarray, delta: float | None) -> LogPowerLaw:
    return LogPowerLaw(np.log(np.stack([n, d])), np.log(loss), delta)


def _refit_vector(
    n: np.ndarray, d: np.ndarray, loss: np.ndarray, *, starts: np.ndarray, delta: float | None
) -> np.ndarray:
    """Refit on a resample; [E, A, B, alpha, beta, a, b, G] or NaN."""
    best = minimize_from_starts(_objective(n, d, loss, delta), starts, 1, method="BFGS")
    if not np.all(np.isfinite(best.theta)):
        return np.full(len(PARAM_NAMES) + len(DERIVED_NAMES), np.nan)
    params = params_from_theta(best.theta)
    return np.array([*params.values(), *allocation_exponents(params).values()])


# A term that stays under 0.1% of the loss everywhere was switched off by the optimiser.
VANISHED_FRACTION = 1e-3


def _vanished_terms(params: dict, n: np.ndarray, d: np.ndarray, y: np.ndarray) -> list[str]:
    terms = {
        "A/N^alpha": params["A"] / n ** params["alpha"],
        "B/D^beta": params["B"] / d ** params["beta"],
    }
    return [name for name, value in terms.items() if np.all(value < VANISHED_FRACTION * y)]


def fit_surface(
    n_params,
    tokens,
    loss,
    *,
    delta: float | None = HUBER_DELTA,
    starts: np.ndarray | None = None,
    num_resamples: int = 0,
    seed: int = 0,
    workers: int = 1,
    warm_starts: int = 2,
    target: str = "loss(N, D)",
    units: dict[str, str] | None = None,
) -> FitResult:
    """Fit L(N, D) = E + A/N^alpha + B/D^beta (Epoch's protocol) with optional bootstrap.

    Args:
        n_params: [n] parameters per model (say in `units` which count: total or active).
        tokens: [n] training tokens.
        loss: [n] final loss.
        delta: Huber delta on log residuals (None = least squares).
        starts: [S, 5] starts in layout [a, b, alpha, beta, e]; default Epoch's 4,500-point grid.
        num_resamples: bootstrap resamples of the points (0 = none).
        seed: bootstrap seed.
        workers: processes for the grid and the bootstrap.
        warm_starts: bootstrap refits start from this many distinct local optima of the full-data
            fit (the full grid per resample costs ~4,500x; the optima it finds are these).
        target, units: recorded on the result.

    Returns:
        FitResult with params E, A, B, alpha, beta; derived a, b, G; intervals when bootstrapped.
    """
    n = checks.positive_finite("N", n_params)
    d = checks.positive_finite("D", tokens)
    y = checks.positive_finite("loss", loss)
    checks.same_length(N=n, D=d, loss=y)
    checks.enough_points(len(y), 5, "the Chinchilla surface")
    units = units or DEFAULT_UNITS
    starts = epoch_start_grid() if starts is None else np.asarray(starts, dtype=np.float64)
    best = minimize_from_starts(_objective(n, d, y, delta), starts, warm_starts, workers)
    if not np.all(np.isfinite(best.theta)):
        return failed(target, units, best.message, len(y))
    params = params_from_theta(best.theta)
    success, message = best.success, best.message
    out_of_bounds = [verdict.exponent_reason(p, params[p]) for p in ("alpha", "beta")]
    if params["alpha"] <= 0 or params["beta"] <= 0:
        success, message = False, "fitted exponent alpha or beta <= 0: loss does not fall with N/D"
    elif any(out_of_bounds):
        success, message = False, "; ".join(r for r in out_of_bounds if r)
    vanished = _vanished_terms(params, n, d, y)
    if vanished:
        success = False
        message = (
            f"term(s) {vanished} below 0.1% of the loss at every point: the data do not show it"
        )
    result = FitResult(
        target=target,
        units=units,
        params=params,
        success=success,
        message=message,
        n_points=len(y),
        derived=allocation_exponents(params),
        extra={
            "objective": "sum Huber(log L - LSE(a - alpha log N, b - beta log D, e))",
            "huber_delta": delta,
            "objective_value": best.value,
            "num_starts": best.num_starts,
            "optimizer": "L-BFGS-B (SciPy defaults) from every start, best polished by BFGS",
        },
    )
    if num_resamples <= 0:
        return result
    refit = functools.partial(_refit_vector, starts=best.local_optima, delta=delta)
    draws = run_bootstrap(
        refit,
        [n, d, y],
        PARAM_NAMES + DERIVED_NAMES,
        num_resamples=num_resamples,
        seed=seed,
        workers=workers,
        unit="runs",
    )
    extra = {
        **result.extra,
        "bootstrap": {
            **draws.summary(),
            "starts": "BFGS from full-data local optima",
            "num_warm_starts": len(best.local_optima),
        },
    }
    return result.replace(intervals=draws.intervals(), extra=extra)


def fit_surface_vpnls(
    n_params,
    tokens,
    loss,
    *,
    grid_step: float = 0.02,
    target: str = "loss(N, D)",
    units: dict[str, str] | None = None,
) -> FitResult:
    """Variable projection cross-check: NNLS for (E, A, B) inside a search over (alpha, beta).

    Squared error on L itself (not log, not Huber): a different estimator on purpose, so that
    agreement on a, N*(C) is evidence and not an echo (Open-Athena 2026, arXiv:2603.22339).
    A dense grid over alpha, beta in [grid_step, 1.5] then Nelder-Mead from the best cell.
    """
    n = checks.positive_finite("N", n_params)
    d = checks.positive_finite("D", tokens)
    y = checks.positive_finite("loss", loss)
    checks.same_length(N=n, D=d, loss=y)
    checks.enough_points(len(y), 5, "the VPNLS surface")
    units = units or DEFAULT_UNITS
    log_n, log_d = np.log(n), np.log(d)

    def inner(exps: np.ndarray) -> tuple[float, np.ndarray]:
        cols = np.stack([np.ones_like(y), np.exp(-exps[0] * log_n), np.exp(-exps[1] * log_d)], 1)
        scale = np.linalg.norm(cols, axis=0)
        if not np.all(scale > 0):
            # Nelder-Mead may walk to exponents so large that a term underflows to zero.
            return np.inf, np.full(3, np.nan)
        coef, resid = nnls(cols / scale, y)
        return float(resid**2), coef / scale

    axis = np.arange(grid_step, 1.5 + 1e-9, grid_step)
    cells = cartesian_grid(axis, axis)
    values = np.array([inner(c)[0] for c in cells])
    start = cells[int(np.argmin(values))]
    res = minimize(
        lambda e: inner(np.abs(e))[0],
        start,
        method="Nelder-Mead",
        options={"xatol": 1e-6, "fatol": 1e-12},
    )
    exps = np.abs(res.x)
    sse, coef = inner(exps)
    params = {"E": coef[0], "A": coef[1], "B": coef[2], "alpha": exps[0], "beta": exps[1]}
    success = bool(res.success) and min(coef) > 0
    message = str(res.message) if success else "NNLS put a coefficient at zero or search failed"
    return FitResult(
        target=target,
        units=units,
        params={k: float(v) for k, v in params.items()},
        success=success,
        message=message,
        n_points=len(y),
        derived=allocation_exponents(params) if min(coef) > 0 else {},
        extra={
            "objective": "sum (L - L_hat)^2, NNLS in (E, A, B)",
            "sse": sse,
            "grid_step": grid_step,
        },
    )
