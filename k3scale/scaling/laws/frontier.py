"""Compute frontiers L(C) (methods.md 2.1, 2.6): the lower envelope of points in (C, L), the
inversion C(L) that turns two frontiers into a compute multiplier M(C), and the parametric law
L(C) = E + A * C^-alpha.

The envelope rule (`record_lows`) and the inversion (`multiplier`) are the only ones in the
project: the studies' compute-optimal routes (compute_optimal.py) and the generic comparison of
fitted laws (frontier_compare.py) both use them.

Fitted in log space as `log L = LSE(a - alpha log(C / C_ref), e)` with a summed Huber loss on
log residuals over a grid of starts (Porian et al. 2024 fit log loss from a grid of starts;
delta as in Epoch's protocol). `C_ref` (the geometric mean of the data's compute) only conditions
the optimisation; the reported A is in raw units: L = E + A * C^-alpha with C in FLOPs.
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

PARAM_NAMES = ("E", "A", "alpha")
TARGET = "loss(C)"
DEFAULT_UNITS = {"C": "FLOPs", "L": "nats/token"}
# A power term under 0.1% of the loss at every point was switched off by the optimiser.
VANISHED_FRACTION = 1e-3


def record_lows(values: np.ndarray) -> np.ndarray:
    """Mask of the entries lower than every entry before them.

    With values ordered by compute these are the Pareto points (no cheaper point reaches as low):
    the one definition of the lower envelope that the envelope route, the multiplier's inversion
    and the Pareto count share.
    """
    best = np.minimum.accumulate(values)
    return np.concatenate([[True], best[1:] < best[:-1]])


def multiplier(
    base_curve: np.ndarray, base_compute: np.ndarray, new_loss: np.ndarray, at: np.ndarray
) -> np.ndarray:
    """M(C) [S, m] = C_base(L_new(C)) / C, by inverting the baseline curve [S, g] on its grid.

    The one M(C) inversion: a frontier never rises with compute, so the curve's record lows
    are inverted by linear interpolation in log C. NaN where L_new(C) lies outside the
    baseline curve's range (extrapolation) or is NaN.
    """
    out = np.full(new_loss.shape, np.nan)
    log_c = np.log(base_compute)
    for s in range(base_curve.shape[0]):
        curve = base_curve[s]
        ok = np.isfinite(curve)
        if ok.sum() < 2:
            continue
        keep = record_lows(curve[ok])
        x, y = log_c[ok][keep], curve[ok][keep]
        if len(y) < 2:
            continue
        target = new_loss[s]
        inside = np.isfinite(target) & (target <= y[0]) & (target >= y[-1])
        log_match = np.interp(-target, -y, x)
        out[s] = np.where(inside, np.exp(log_match) / at, np.nan)
    return out


# The frontier law's exponents tried by `fit_frontier_grid`: 0.005-3 in 1% steps, far wider than
# the exponents seen in practice (about 0.05-0.5) so that the data, not the grid, bound them.
FRONTIER_EXPONENTS = np.geomspace(0.005, 3.0, 640)


def fit_frontier_grid(
    log_c: np.ndarray, losses: np.ndarray, keep: np.ndarray, pinned_e: float | None = None
) -> np.ndarray:
    """Least-squares L(C) = E + K C^-alpha through each row's kept points: [S, 3] (E, K', alpha)
    with K' the coefficient at the data's geometric-mean compute, NaN for rows with < 3 points
    (< 2 with E pinned).

    The envelope route's curve through its Pareto points, every draw at once (methods.md 2.1,
    fit (b)): for a fixed alpha the law is linear in (E, K'), solved in closed form for every
    row and every alpha of FRONTIER_EXPONENTS; alphas that would make the law rise with compute
    are dropped and the least residual wins. Any Chinchilla surface's compute-optimal frontier
    under C = 6ND is exactly this law, so unlike straight chords between the points it does not
    zigzag around the frontier between them. Use `predict_frontier_grid` to read it.
    `pinned_e` fixes E (0: a pure power law, the asymptote pinned as Marin pins it) and fits
    K' alone for each alpha.

    log_c: [P] log compute of the points; losses: [S, P]; keep: [S, P] the points each row uses.
    """
    t = log_c - log_c.mean()
    z = np.exp(-FRONTIER_EXPONENTS[:, None] * t[None])  # [A, P]
    w = keep.astype(float)
    n = w.sum(axis=1)[:, None]
    if pinned_e is not None:
        y = np.where(keep, losses - pinned_e, 0.0)
        s_zz, s_zy, s_yy = w @ (z * z).T, y @ z.T, (y * y).sum(axis=1)[:, None]
        k = s_zy / s_zz
        e = np.full_like(k, pinned_e)
        rss = np.where(k > 0, s_yy - k * s_zy, np.inf)
        y_mean, min_points = np.zeros(len(losses)), 2
    else:
        y = np.where(keep, losses, 0.0)
        y_mean = y.sum(axis=1) / np.maximum(w.sum(axis=1), 1)
        y = np.where(keep, y - y_mean[:, None], 0.0)  # centred: the sums below stay well scaled
        s_z, s_zz, s_zy = w @ z.T, w @ (z * z).T, y @ z.T  # [S, A]
        s_y, s_yy = y.sum(axis=1)[:, None], (y * y).sum(axis=1)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            k = (n * s_zy - s_z * s_y) / (n * s_zz - s_z * s_z)
            e = (s_y - k * s_z) / n
        rss = np.where(k > 0, s_yy - e * s_y - k * s_zy, np.inf)
        min_points = 3
    best = np.argmin(np.where(np.isfinite(rss), rss, np.inf), axis=1)
    rows = np.arange(len(best))
    out = np.column_stack([e[rows, best] + y_mean, k[rows, best], FRONTIER_EXPONENTS[best]])
    out[(n[:, 0] < min_points) | ~np.isfinite(rss[rows, best])] = np.nan
    return out


def exponent_on_bound(alpha: float) -> bool:
    """Whether a `fit_frontier_grid` exponent sits at an end of FRONTIER_EXPONENTS: the data did
    not bound it (at 0.005 the law is a straight line in log C and E runs off to minus
    infinity)."""
    return bool(alpha <= FRONTIER_EXPONENTS[0] * 1.001 or alpha >= FRONTIER_EXPONENTS[-1] * 0.999)


def predict_frontier_grid(
    params: np.ndarray, log_c: np.ndarray, at_log_c: np.ndarray
) -> np.ndarray:
    """[S, m] L(C) at log compute `at_log_c` [m] from `fit_frontier_grid`'s [S, 3] on points at
    `log_c` (whose mean is the law's reference compute)."""
    t = at_log_c - log_c.mean()
    e, k, alpha = (params[:, i : i + 1] for i in range(3))
    return e + k * np.exp(-alpha * t[None])


def frontier_grid_log_compute(
    params: np.ndarray, log_c: np.ndarray, loss: np.ndarray
) -> np.ndarray:
    """[S] log compute at which each row of `fit_frontier_grid`'s law [S, 3] reaches `loss` [S]:
    the law's inverse, NaN where the loss is at or below the law's floor E."""
    e, k, alpha = params[:, 0], params[:, 1], params[:, 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        t = -np.log((loss - e) / k) / alpha
    return t + log_c.mean()


def frontier_starts(min_loss: float) -> np.ndarray:
    """Grid of starts [45, 3] in layout [a, alpha, e] (a at C = C_ref), scaled by the data.

    alpha spans the exponents seen in practice (Kimi Linear ~0.05 to Porian's ~0.35 and beyond);
    E spans 30-90% of the smallest loss; A spans 2-100% of it at the reference compute.
    """
    alphas = np.array([0.05, 0.1, 0.2, 0.4, 0.8])
    e = np.log(min_loss * np.array([0.3, 0.6, 0.9]))
    a = np.log(min_loss * np.array([0.02, 0.15, 1.0]))
    return cartesian_grid(a, alphas, e)


def frontier_params(theta: np.ndarray, log_c_ref: float) -> dict[str, float]:
    """[a, alpha, e] at C_ref -> {"E", "A", "alpha"} with A in raw FLOP units."""
    return {
        "E": float(np.exp(theta[2])),
        "A": float(np.exp(theta[0] + theta[1] * log_c_ref)),
        "alpha": float(theta[1]),
    }


def predict_frontier(params: dict[str, float], compute) -> np.ndarray:
    """L(C) = E + A C^-alpha, [m] for compute [m] (FLOPs)."""
    c = np.asarray(compute, dtype=np.float64)
    return params["E"] + params["A"] * c ** -params["alpha"]


def _objective(c: np.ndarray, loss: np.ndarray, log_c_ref: float, delta: float | None):
    return LogPowerLaw((np.log(c) - log_c_ref)[None], np.log(loss), delta)


def refit_frontier_vector(
    c: np.ndarray, loss: np.ndarray, *, starts: np.ndarray, log_c_ref: float, delta: float | None
) -> np.ndarray:
    """Refit on a resample (BFGS from warm starts); [E, A, alpha] or NaN."""
    if len(np.unique(c)) < 3:
        return np.full(3, np.nan)
    best = minimize_from_starts(_objective(c, loss, log_c_ref, delta), starts, 1, method="BFGS")
    if not np.all(np.isfinite(best.theta)):
        return np.full(3, np.nan)
    return np.array(list(frontier_params(best.theta, log_c_ref).values()))


def check_inputs(compute, loss, step: str = "frontier fit") -> tuple[np.ndarray, np.ndarray]:
    """Validated float arrays (C, L) with at least 4 points and 3 distinct compute values."""
    c = checks.positive_finite("compute", compute, step)
    y = checks.positive_finite("loss", loss, step)
    checks.same_length(step, compute=c, loss=y)
    checks.enough_points(len(y), 3, "L(C) = E + A C^-alpha", step)
    if len(np.unique(c)) < 3:
        raise checks.K3ScaleError(
            f"{step}: needs at least 3 distinct compute values, got {len(np.unique(c))}"
        )
    return c, y


def fit_frontier(
    compute,
    loss,
    *,
    starts: np.ndarray | None = None,
    options: FitOptions = DEFAULT_OPTIONS,
    units: dict[str, str] | None = None,
) -> FitResult:
    """Fit L(C) = E + A C^-alpha (target "loss(C)") with optional bootstrap over points.

    Args:
        compute: [n] training FLOPs of each point (state the convention in `units`).
        loss: [n] loss of each point (a per-cell tuned optimum, or any run on the envelope).
        starts: [S, 3] starts in layout [a (at C_ref), alpha, e]; default `frontier_starts`.
        options: Huber delta, bootstrap and workers.
        units: recorded on the result.
    """
    c, y = check_inputs(compute, loss)
    units = units or DEFAULT_UNITS
    log_c_ref = float(np.mean(np.log(c)))
    starts = frontier_starts(float(y.min())) if starts is None else np.asarray(starts, float)
    objective = _objective(c, y, log_c_ref, options.delta)
    best = minimize_from_starts(objective, starts, options.warm_starts, options.workers)
    if not np.all(np.isfinite(best.theta)):
        return failed(TARGET, units, best.message, len(y))
    params = frontier_params(best.theta, log_c_ref)
    success, message = best.success, best.message
    if params["alpha"] <= 0:
        success, message = False, "fitted exponent alpha <= 0: loss does not fall with compute"
    elif verdict.exponent_reason("alpha", params["alpha"]):
        success, message = False, verdict.exponent_reason("alpha", params["alpha"])
    elif np.all(params["A"] * c ** -params["alpha"] < VANISHED_FRACTION * y):
        success, message = False, "A C^-alpha below 0.1% of the loss everywhere: no trend in C"
    result = FitResult(
        target=TARGET,
        units=units,
        params=params,
        success=success,
        message=message,
        n_points=len(y),
        extra={
            **best.record("sum Huber(log L - LSE(a - alpha log(C/C_ref), e))", options),
            "log_c_ref": log_c_ref,
            "compute_range": [float(c.min()), float(c.max())],
            "warm_starts": best.local_optima.tolist(),
        },
    )
    if options.num_resamples <= 0:
        return result
    refit = functools.partial(
        refit_frontier_vector, starts=best.local_optima, log_c_ref=log_c_ref, delta=options.delta
    )
    draws = options.bootstrap(refit, [c, y], PARAM_NAMES, unit="points")
    return result.replace(
        intervals=draws.intervals(), extra={**result.extra, "bootstrap": draws.summary()}
    )
