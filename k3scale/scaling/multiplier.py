"""Architecture (or schedule) compute multiplier between fitted frontiers (methods.md 2.6).

- Matched compute: `M(C) = C_base(L_new(C)) / C`, the factor of extra compute the baseline needs
  to reach the loss the new arm reaches with C; `C_base(L) = (A_b / (L - E_b))^(1/alpha_b)`,
  undefined (NaN) where `L_new(C) <= E_b`.
- Shared-exponent model: `L = E + A (k_g C)^-alpha` with E, A, alpha shared and k_base = 1, so
  k_new is one multiplier. Tested against separate frontiers (free E, A, alpha per group) with an
  F-test on log residuals, both nested models fitted by least squares on log L.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import brentq, minimize
from scipy.stats import f as f_dist

from k3scale.scaling.frontier import fit_frontier, predict_frontier
from k3scale.scaling.objective import single_threaded_blas

# Conventional 5% level for "rejected" (the p-value itself is always reported).
REJECT_LEVEL = 0.05


def multiplier_at(base: dict[str, float], new: dict[str, float], compute) -> np.ndarray:
    """M(C) = C_base(L_new(C)) / C, [m] for compute [m]; NaN where L_new(C) <= E_base."""
    c = np.asarray(compute, dtype=np.float64)
    gap = predict_frontier(new, c) - base["E"]
    with np.errstate(all="ignore"):
        c_base = np.where(gap > 0, (base["A"] / gap) ** (1.0 / base["alpha"]), np.nan)
    return c_base / c


def crossovers(base: dict[str, float], new: dict[str, float], c_lo: float, c_hi: float) -> list:
    """Compute values in [c_lo, c_hi] where L_base(C) = L_new(C) (sign changes, refined)."""
    log_grid = np.linspace(np.log(c_lo), np.log(c_hi), 400)

    def diff(log_c: float) -> float:
        return float(predict_frontier(base, np.exp(log_c)) - predict_frontier(new, np.exp(log_c)))

    values = np.array([diff(x) for x in log_grid])
    roots = []
    for i in np.flatnonzero(np.sign(values[:-1]) * np.sign(values[1:]) < 0):
        roots.append(float(np.exp(brentq(diff, log_grid[i], log_grid[i + 1]))))
    return roots


@dataclasses.dataclass(frozen=True)
class SharedExponentObjective:
    """Least-squares objective of `log L = LSE(a - alpha (log C - log C_ref + log k_g), e)`.

    Parameter layout [3 + G - 1]: [a, alpha, e, log k_1, ..., log k_{G-1}]; group 0 is the
    baseline (k = 1).

    Attributes:
        log_c: [n] centred log compute (log C - log C_ref).
        log_y: [n] log loss.
        group: [n] int group codes, 0 = baseline.
        num_groups: G.
    """

    log_c: np.ndarray
    log_y: np.ndarray
    group: np.ndarray
    num_groups: int

    def residuals(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(log residuals [n], effective log compute [n], power-term softmax weight [n])."""
        log_k = np.concatenate([[0.0], theta[3:]])
        x = self.log_c + log_k[self.group]
        z1 = theta[0] - theta[1] * x
        peak = np.maximum(z1, theta[2])
        e1, e2 = np.exp(z1 - peak), np.exp(theta[2] - peak)
        return self.log_y - peak - np.log(e1 + e2), x, e1 / (e1 + e2)

    def value_and_grad(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        r, x, w1 = self.residuals(theta)
        grad = np.empty_like(theta)
        grad[0] = -(r * w1).sum()
        grad[1] = (r * w1 * x).sum()
        grad[2] = -(r * (1 - w1)).sum()
        per_point = r * w1 * theta[1]
        grad[3:] = np.bincount(self.group, per_point, self.num_groups)[1:]
        return 0.5 * float(r @ r), grad


def fit_shared_exponent(
    compute: np.ndarray,
    loss: np.ndarray,
    group: np.ndarray,
    num_groups: int,
    separate: list,
    shifts: tuple[float, ...] = (0.0, 1.0, -1.0),
) -> tuple[dict, float]:
    """Least-squares fit of the shared-exponent model.

    Args:
        compute, loss: [n] points of all groups.
        group: [n] int codes, 0 = baseline.
        num_groups: G.
        separate: per-group least-squares frontier params (dicts), used for the starts.
        shifts: offsets of log k tried as starts around the separate fits' matched multiplier.

    Returns:
        ({"E", "A", "alpha", "k": [G] multipliers (k[0] = 1)}, residual sum of squares of log L).
    """
    log_c_ref = float(np.mean(np.log(compute)))
    objective = SharedExponentObjective(
        np.log(compute) - log_c_ref, np.log(loss), group, num_groups
    )
    base = separate[0]
    a0 = np.log(base["A"]) - base["alpha"] * log_c_ref
    log_k0 = []
    mid = np.exp(log_c_ref)
    for params in separate[1:]:
        m = multiplier_at(base, params, [mid])[0]
        log_k0.append(np.log(m) if np.isfinite(m) and m > 0 else 0.0)
    best = None
    for shift in shifts:
        start = np.array([a0, base["alpha"], np.log(base["E"]), *(np.array(log_k0) + shift)])
        with single_threaded_blas(), np.errstate(all="ignore"):
            res = minimize(objective.value_and_grad, start, jac=True, method="BFGS")
        if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    theta = best.x
    params = {
        "E": float(np.exp(theta[2])),
        "A": float(np.exp(theta[0] + theta[1] * log_c_ref)),
        "alpha": float(theta[1]),
        "k": [1.0, *np.exp(theta[3:]).tolist()],
    }
    return params, 2.0 * float(best.fun)


def shared_exponent_test(
    compute: np.ndarray,
    loss: np.ndarray,
    group: np.ndarray,
    num_groups: int,
    starts: list[np.ndarray | None] | None = None,
) -> dict:
    """F-test of the shared-exponent model against separate frontiers, on log residuals.

    Both nested models are fitted by least squares on log L. Separate: 3G parameters; shared:
    3 + (G - 1). F = ((RSS_shared - RSS_sep) / (2 (G - 1))) / (RSS_sep / (n - 3G)).

    Args:
        compute, loss, group, num_groups: points, group codes (0 = baseline) and G.
        starts: optional per-group frontier starts (e.g. the Huber fits' optima); default grid.
    """
    separate, rss_sep = [], 0.0
    starts = starts or [None] * num_groups
    for g in range(num_groups):
        fit = fit_frontier(compute[group == g], loss[group == g], delta=None, starts=starts[g])
        separate.append(fit.params)
        pred = predict_frontier(fit.params, compute[group == g])
        rss_sep += float(np.sum((np.log(loss[group == g]) - np.log(pred)) ** 2))
    shared, rss_shared = fit_shared_exponent(compute, loss, group, num_groups, separate)
    df_num, df_den = 2 * (num_groups - 1), len(loss) - 3 * num_groups
    if df_den <= 0:
        return {"p_value": None, "message": f"needs more than {3 * num_groups} points in total"}
    statistic = max(rss_shared - rss_sep, 0.0) / df_num / (rss_sep / df_den)
    return {
        "method": "F-test on log residuals; both nested models fitted by least squares on log L",
        "statistic": statistic,
        "df": [df_num, df_den],
        "p_value": float(f_dist.sf(statistic, df_num, df_den)),
        "rss_shared": rss_shared,
        "rss_separate": rss_sep,
        "shared_fit": shared,
    }
