"""Chinchilla Approach 3: L(N, D) = E + A/N^alpha + B/D^beta with Epoch's protocol (methods.md 2.4).

Objective: summed Huber (delta = 1e-3) on log residuals, log-sum-exp parametrisation
`a = log A, b = log B, e = log E`, L-BFGS-B from every point of Epoch's 4,500-point grid, best
kept (Besiroglu et al. 2024, arXiv:2404.10102). `fit_surface_grid` is the studies' fit of many
draws at once: least squares on the loss, variable projection over an exponent grid.
"""

from __future__ import annotations

import functools

import numpy as np

from k3scale.scaling.laws.objective import (
    DEFAULT_OPTIONS,
    FitOptions,
    LogPowerLaw,
    cartesian_grid,
    minimize_from_starts,
)
from k3scale.scaling.values import checks, verdict
from k3scale.scaling.values.result import FitResult, failed

PARAM_NAMES = ("E", "A", "B", "alpha", "beta")
DERIVED_NAMES = ("a", "b", "G")
DEFAULT_UNITS = {"N": "parameters", "D": "tokens", "L": "nats/token", "C": "FLOPs"}


# The studies' grid fit (`fit_surface_grid`): exponents searched, and draws solved per GEMM.
EXPONENT_GRID = np.round(np.arange(0.05, 2.0001, 0.025), 4)
DRAW_CHUNK = 64


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


def surface_params(theta: np.ndarray) -> dict[str, float]:
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


def _objective(n: np.ndarray, d: np.ndarray, loss: np.ndarray, delta: float | None) -> LogPowerLaw:
    return LogPowerLaw(np.log(np.stack([n, d])), np.log(loss), delta)


def _refit_vector(
    n: np.ndarray, d: np.ndarray, loss: np.ndarray, *, starts: np.ndarray, delta: float | None
) -> np.ndarray:
    """Refit on a resample; [E, A, B, alpha, beta, a, b, G] or NaN."""
    best = minimize_from_starts(_objective(n, d, loss, delta), starts, 1, method="BFGS")
    if not np.all(np.isfinite(best.theta)):
        return np.full(len(PARAM_NAMES) + len(DERIVED_NAMES), np.nan)
    params = surface_params(best.theta)
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
    starts: np.ndarray | None = None,
    options: FitOptions = DEFAULT_OPTIONS,
    target: str = "loss(N, D)",
    units: dict[str, str] | None = None,
) -> FitResult:
    """Fit L(N, D) = E + A/N^alpha + B/D^beta (Epoch's protocol) with optional bootstrap.

    Args:
        n_params: [n] parameters per model (say in `units` which count: total or active).
        tokens: [n] training tokens.
        loss: [n] final loss.
        starts: [S, 5] starts in layout [a, b, alpha, beta, e]; default Epoch's 4,500-point grid.
        options: Huber delta, bootstrap resamples of the runs, and workers for the grid and the
            bootstrap.
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
    objective = _objective(n, d, y, options.delta)
    best = minimize_from_starts(objective, starts, options.warm_starts, options.workers)
    if not np.all(np.isfinite(best.theta)):
        return failed(target, units, best.message, len(y))
    params = surface_params(best.theta)
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
        derived=allocation_exponents(params),
        success=success,
        message=message,
        n_points=len(y),
        extra={
            **best.record("sum Huber(log L - LSE(a - alpha log N, b - beta log D, e))", options),
            "optimizer": "L-BFGS-B (SciPy defaults) from every start, best polished by BFGS",
        },
    )
    if options.num_resamples <= 0:
        return result
    refit = functools.partial(_refit_vector, starts=best.local_optima, delta=options.delta)
    draws = options.bootstrap(refit, [n, d, y], PARAM_NAMES + DERIVED_NAMES, unit="runs")
    extra = {
        **result.extra,
        "bootstrap": {
            **draws.summary(),
            "starts": "BFGS from full-data local optima",
            "num_warm_starts": len(best.local_optima),
        },
    }
    return result.replace(intervals=draws.intervals(), extra=extra)


def _exponent_pairs() -> tuple[np.ndarray, np.ndarray]:
    a, b = np.meshgrid(EXPONENT_GRID, EXPONENT_GRID, indexing="ij")
    return a.ravel(), b.ravel()


def fit_surface_grid(n: np.ndarray, d: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """Least-squares L(N, D) for each row of losses [S, k]: [S, 5] of (E, A, alpha, B, beta).

    Variable projection on a grid (Open-Athena's VPNLS idea): for fixed (alpha, beta) the model
    is linear in (E, A, B); every grid pair is solved for every row at once by least squares on
    the loss, pairs with a negative coefficient are dropped, and the best pair wins. Rows where
    no pair gives non-negative (E, A, B) are NaN; exponents on the grid's edge mean the data do
    not bound them.
    """
    alpha, beta = _exponent_pairs()
    n_scale, d_scale = np.exp(np.mean(np.log(n))), np.exp(np.mean(np.log(d)))
    # [P, k, 3] designs, scaled at the data's geometric means for conditioning.
    x = np.stack(
        [
            np.ones((len(alpha), len(n))),
            (n / n_scale)[None] ** -alpha[:, None],
            (d / d_scale)[None] ** -beta[:, None],
        ],
        axis=-1,
    )
    q, r = np.linalg.qr(x)
    r_inv = np.linalg.inv(r)
    # One GEMM projects every draw on every pair's basis: [P * 3, k] @ [k, s].
    q_rows = np.swapaxes(q, 1, 2).reshape(-1, len(n))
    out = np.full((losses.shape[0], 5), np.nan)
    for start in range(0, losses.shape[0], DRAW_CHUNK):
        y = losses[start : start + DRAW_CHUNK].T  # [k, s]
        proj = (q_rows @ y).reshape(len(alpha), 3, -1)  # [P, 3, s]
        coef = np.stack(
            [sum(r_inv[:, i, j, None] * proj[:, j] for j in range(3)) for i in range(3)], axis=1
        )
        rss = np.sum(y * y, axis=0)[None] - np.sum(proj * proj, axis=1)
        rss = np.where(np.all(coef >= 0, axis=1), rss, np.inf)
        best = np.argmin(rss, axis=0)
        ok = np.isfinite(rss[best, np.arange(len(best))])
        c = coef[best, :, np.arange(len(best))]
        params = np.column_stack(
            [
                c[:, 0],
                c[:, 1] * n_scale ** alpha[best],
                alpha[best],
                c[:, 2] * d_scale ** beta[best],
                beta[best],
            ]
        )
        params[~ok] = np.nan
        out[start : start + DRAW_CHUNK] = params
    return out
