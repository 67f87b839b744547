"""Chinchilla Approach 2: IsoFLOP minima, then N_opt(C) as a power law (methods.md 2.3).

Per compute budget, the loss-vs-size curve is either a quadratic in x = log N (Hoffmann et al.
2022) or an Akima spline of log L in log N evaluated on a 25x denser grid (Porian et al. 2024).
Minima on the edge of the sizes tried, or budgets with too few sizes, are excluded and named.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.interpolate import Akima1DInterpolator

from k3scale.errors import K3ScaleError
from k3scale.scaling.laws.bootstrap import run_bootstrap
from k3scale.scaling.laws.powerlaw import fit_power_law
from k3scale.scaling.values import checks

METHODS = ("quadratic", "akima")
# Porian et al. 2024 (analysis code): interpolate on a grid ~25x denser than the sizes tried.
AKIMA_DENSITY = 25
# Hoffmann et al. 2022 fit parabolas to 5-9 sizes; 3 is the least a quadratic can be fitted to.
MIN_SIZES = 3


def compute_level(compute: float) -> float:
    """The IsoFLOP level of a compute value: C to 2 significant digits, so cells of one design
    budget whose FLOPs differ by rounding (or by a few percent of attention) share a level."""
    return float(f"{compute:.2g}")


def isoflop_minimum(n_params: np.ndarray, loss: np.ndarray, method: str = "quadratic") -> dict:
    """Size that minimises loss at one budget.

    Args:
        n_params: [m] model sizes at this budget (parameters).
        loss: [m] their losses.
        method: "quadratic" (L in log N) or "akima" (log L in log N).

    Returns:
        {"n_opt", "loss_opt", "interior" (minimum strictly inside the sizes tried), "num_sizes"}.
    """
    order = np.argsort(n_params)
    x, y = np.log(n_params[order]), loss[order]
    if method == "quadratic":
        p2, p1, p0 = np.polyfit(x, y, 2)
        if p2 <= 0:
            return {
                "n_opt": float("nan"),
                "loss_opt": float("nan"),
                "interior": False,
                "num_sizes": len(x),
            }
        x_opt = -p1 / (2 * p2)
        loss_opt = p0 + p1 * x_opt + p2 * x_opt**2
        interior = bool(x[0] < x_opt < x[-1])
    elif method == "akima":
        ux, inverse = np.unique(x, return_inverse=True)
        uy = np.bincount(inverse, np.log(y)) / np.bincount(inverse)
        dense = np.linspace(ux[0], ux[-1], AKIMA_DENSITY * len(ux))
        curve = Akima1DInterpolator(ux, uy)(dense)
        i = int(np.argmin(curve))
        x_opt, loss_opt = dense[i], float(np.exp(curve[i]))
        interior = 0 < i < len(dense) - 1
    else:
        raise K3ScaleError(f"isoflop: method must be one of {METHODS}, got {method!r}")
    return {
        "n_opt": float(np.exp(x_opt)),
        "loss_opt": float(loss_opt),
        "interior": interior,
        "num_sizes": len(x),
    }


def isoflop_minima(budgets, n_params, loss, method: str = "quadratic") -> list[dict]:
    """`isoflop_minimum` of every budget, each with "compute" and "used" (kept for the fit)."""
    out = []
    for c in np.unique(budgets):
        members = budgets == c
        sizes = len(np.unique(n_params[members]))
        if sizes < MIN_SIZES:
            out.append(
                {
                    "compute": float(c),
                    "num_sizes": sizes,
                    "used": False,
                    "reason": f"fewer than {MIN_SIZES} sizes",
                }
            )
            continue
        best = isoflop_minimum(n_params[members], loss[members], method)
        reason = "" if best["interior"] else "minimum on the edge of the sizes tried (or none)"
        out.append({"compute": float(c), **best, "used": best["interior"], "reason": reason})
    return out


def _refit(budgets, n_params, loss, *, method) -> np.ndarray:
    minima = [m for m in isoflop_minima(budgets, n_params, loss, method) if m["used"]]
    if len(minima) < 3:
        return np.full(2, np.nan)
    c = np.log([m["compute"] for m in minima])
    n = np.log([m["n_opt"] for m in minima])
    slope, intercept = np.polyfit(c, n, 1)
    return np.array([intercept, slope])


def fit_isoflop(
    budgets,
    n_params,
    loss,
    *,
    method: str = "quadratic",
    num_resamples: int = 0,
    seed: int = 0,
    workers: int = 1,
    target: str = "n_opt(C)",
    units: dict[str, str] | None = None,
):
    """Approach 2: minima per budget, then log N_opt = log k + a log C (D_opt = C / (6 N_opt)).

    Args:
        budgets: [n] compute budget of each run (FLOPs; runs of one budget share the value).
        n_params: [n] model size of each run (parameters).
        loss: [n] final loss of each run.
        method: "quadratic" or "akima".
        num_resamples, seed, workers: bootstrap over runs within each budget.

    Returns:
        FitResult with params {"k", "exp_C"} (= a), derived b = 1 - a, minima in extra.
    """
    c = checks.positive_finite("compute budget", budgets, "isoflop fit")
    n = checks.positive_finite("N", n_params, "isoflop fit")
    y = checks.positive_finite("loss", loss, "isoflop fit")
    checks.same_length("isoflop fit", budget=c, N=n, loss=y)
    minima = isoflop_minima(c, n, y, method)
    used = [m for m in minima if m["used"]]
    if len(used) < 3:
        raise K3ScaleError(
            f"isoflop fit: needs at least 3 budgets with an interior minimum over >= {MIN_SIZES} "
            f"sizes, got {len(used)} of {len(minima)}; add sizes around the optimum"
        )
    result = fit_power_law(
        {"C": np.array([m["compute"] for m in used])},
        np.array([m["n_opt"] for m in used]),
        target=target,
        units=units or {"C": "FLOPs", "N": "parameters"},
    )
    result = result.replace(
        derived={**result.derived, "a": result.params["exp_C"], "b": 1 - result.params["exp_C"]},
        extra={**result.extra, "method": method, "minima": minima},
    )
    if num_resamples <= 0:
        return result
    draws = run_bootstrap(
        functools.partial(_refit, method=method),
        [c, n, y],
        ["log_k", "exp_C"],
        num_resamples=num_resamples,
        seed=seed,
        workers=workers,
        strata=c,
        unit="runs within each budget",
    )
    intervals = draws.intervals()
    intervals["a"] = intervals["exp_C"]
    intervals["b"] = [1 - intervals["exp_C"][1], 1 - intervals["exp_C"][0]]
    return result.replace(intervals=intervals, extra={**result.extra, "bootstrap": draws.summary()})
