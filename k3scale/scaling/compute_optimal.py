"""Compute-optimal frontiers of an arm and the compute multiplier between arms (methods.md 2.1-2.6).

A frontier is never fitted through every cell optimum: a cell that another cell beats at lower
compute is not on it. Two routes, side by side:

- "surface" (Chinchilla Approach 3): fit L(N, D) = E + A N^-alpha + B D^-beta to the arm's cell
  optima, then L*(C) = min over N of L(N, C / k(N)) with N and D kept inside the data's ranges
  (k(N) = FLOPs per token under the convention in use, interpolated over the arm's rungs);
- "envelope" (Approach 1, model-free): the Pareto points of the cell optima in (C, L), joined
  linearly in log C.

The multiplier M(C) = C_base(L*_new(C)) / C (the baseline compute that matches the new arm's loss
at C) is read only inside the compute range both arms cover, and only where the new arm's loss
lies inside the baseline frontier's own range (no extrapolation). Every route is evaluated on the
draws of the cell optima (k3scale/scaling/optimum.py), so its percentile interval carries the
tuning and run noise of every cell; each draw refits the surface.

The surface fit here is variable projection on a grid (Open-Athena's VPNLS idea): for fixed
(alpha, beta) the model is linear in (E, A, B); every grid pair is solved for every draw at once
by least squares on the loss, pairs with a negative coefficient are dropped, and the best pair
wins. Exponents on the grid's edge mean the data do not bound them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from k3scale.scaling import verdict

EXPONENT_GRID = np.round(np.arange(0.05, 2.0001, 0.025), 4)
N_GRID = 64
C_GRID = 9
BASE_GRID = 128
MIN_SURFACE_POINTS = 6
DRAW_CHUNK = 64
# Share of draws in which a quantity must be defined (no extrapolation) to be identified.
MIN_DEFINED = 0.9
# A 95% percentile interval is read from at least this many defined draws.
MIN_INTERVAL_DRAWS = 20


@dataclasses.dataclass(frozen=True)
class ArmOptima:
    """One arm's identified cell optima under one FLOP convention.

    Attributes:
        name: arm (an architecture or a schedule).
        n, d: [k] parameters and tokens of each cell.
        compute: [k] training FLOPs of each cell.
        loss: [k] point estimates of the cells' optimum losses.
        draws: [S, k] draws of those losses (the same S for every arm compared).
    """

    name: str
    n: np.ndarray
    d: np.ndarray
    compute: np.ndarray
    loss: np.ndarray
    draws: np.ndarray

    @property
    def compute_range(self) -> tuple[float, float]:
        return float(self.compute.min()), float(self.compute.max())


def _surface_bases() -> tuple[np.ndarray, np.ndarray]:
    a, b = np.meshgrid(EXPONENT_GRID, EXPONENT_GRID, indexing="ij")
    return a.ravel(), b.ravel()


_SURFACE_CACHE: dict[bytes, np.ndarray] = {}
_SURFACE_CACHE_SIZE = 16


def fit_surfaces(n: np.ndarray, d: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """Least-squares L(N, D) for each row of losses [S, k]: [S, 5] of (E, A, alpha, B, beta).

    Rows where no grid pair gives non-negative (E, A, B) are NaN. The surface does not depend
    on the FLOP convention, so the last few results are kept for the other convention's call.
    """
    key = b"".join(np.ascontiguousarray(a, dtype=np.float64).tobytes() for a in (n, d, losses))
    key += str(losses.shape).encode()
    if key not in _SURFACE_CACHE:
        if len(_SURFACE_CACHE) >= _SURFACE_CACHE_SIZE:
            _SURFACE_CACHE.pop(next(iter(_SURFACE_CACHE)))
        _SURFACE_CACHE[key] = _fit_surfaces(n, d, losses)
    return _SURFACE_CACHE[key].copy()


def _fit_surfaces(n: np.ndarray, d: np.ndarray, losses: np.ndarray) -> np.ndarray:
    alpha, beta = _surface_bases()
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


def surface_frontier(params: np.ndarray, arm: ArmOptima, compute: np.ndarray) -> np.ndarray:
    """L*(C) [S, m] = min over N in the arm's range of L(N, C / k(N)), D in the arm's range.

    k(N) (FLOPs per token) is interpolated log-linearly over the arm's cells; NaN where no N
    in range gives a D in range.
    """
    log_n = np.log(arm.n)
    log_k = np.log(arm.compute / arm.d)
    order = np.argsort(log_n)
    grid_n = np.exp(np.linspace(log_n.min(), log_n.max(), N_GRID))
    k_of_n = np.exp(np.interp(np.log(grid_n), log_n[order], log_k[order]))
    d = compute[:, None] / k_of_n[None]  # [m, N]
    inside = (d >= arm.d.min() * (1 - 1e-9)) & (d <= arm.d.max() * (1 + 1e-9))
    e, a, alpha, b, beta = (params[:, i, None, None] for i in range(5))
    with np.errstate(invalid="ignore", over="ignore"):
        loss = e + a * grid_n[None, None] ** -alpha + b * d[None] ** -beta  # [S, m, N]
    loss = np.where(inside[None], loss, np.inf)
    best = loss.min(axis=2)
    return np.where(np.isfinite(best), best, np.nan)


# Computes within this distance in log C (1e-9 relative) are the same compute to the envelope.
COMPUTE_TIE_LOG = 1e-9


def envelope_frontier(arm: ArmOptima, losses: np.ndarray, compute: np.ndarray) -> np.ndarray:
    """Model-free L(C) [S, m]: each row's Pareto points in (log C, L), joined linearly.

    Between the largest Pareto compute and the arm's largest compute the last Pareto loss
    holds (no cheaper-or-equal cell beats it); below the smallest compute it is NaN.
    """
    order = np.argsort(arm.compute)
    log_c = np.log(arm.compute[order])
    # Cells whose computes tie (a grid where N x D repeats, equal only to rounding) are one
    # compute: the best of them is the frontier's point there. Left apart, rounding decided
    # their order, and so which of them the Pareto rule kept (3.19 for a true 2.5 on AVX-512).
    starts = np.flatnonzero(np.concatenate([[True], np.diff(log_c) > COMPUTE_TIE_LOG]))
    log_c = log_c[starts]
    out = np.full((losses.shape[0], len(compute)), np.nan)
    targets = np.log(compute)
    for s, row in enumerate(np.minimum.reduceat(losses[:, order], starts, axis=1)):
        best = np.minimum.accumulate(row)
        keep = np.concatenate([[True], best[1:] < best[:-1]])
        x, y = log_c[keep], best[keep]
        values = np.interp(targets, x, y)
        values[(targets < log_c[0] - 1e-12) | (targets > log_c[-1] + 1e-12)] = np.nan
        out[s] = values
    return out


def multiplier(
    base_curve: np.ndarray, base_compute: np.ndarray, new_loss: np.ndarray, at: np.ndarray
) -> np.ndarray:
    """M(C) [S, m] = C_base(L_new(C)) / C, by inverting the baseline curve [S, g] on its grid.

    NaN where L_new(C) lies outside the baseline curve's range (extrapolation) or is NaN.
    """
    out = np.full(new_loss.shape, np.nan)
    log_c = np.log(base_compute)
    for s in range(base_curve.shape[0]):
        curve = base_curve[s]
        ok = np.isfinite(curve)
        if ok.sum() < 2:
            continue
        y = np.minimum.accumulate(curve[ok])  # a frontier never rises with compute
        x = log_c[ok]
        keep = np.concatenate([[True], y[1:] < y[:-1]])
        x, y = x[keep], y[keep]
        if len(y) < 2:
            continue
        target = new_loss[s]
        inside = np.isfinite(target) & (target <= y[0]) & (target >= y[-1])
        log_match = np.interp(-target, -y, x)
        out[s] = np.where(inside, np.exp(log_match) / at, np.nan)
    return out


def common_grid(arms: list[ArmOptima]) -> np.ndarray | None:
    """C_GRID log-spaced compute values across the range every arm covers, or None."""
    lo = max(a.compute_range[0] for a in arms)
    hi = min(a.compute_range[1] for a in arms)
    if not lo < hi:
        return None
    return np.exp(np.linspace(np.log(lo), np.log(hi), C_GRID))


def summarise(values: np.ndarray, point: np.ndarray, name: str, decades: float) -> list[dict]:
    """Per compute value: point, 95% percentile interval over defined draws, defined share and
    verdict (identified only with >= MIN_DEFINED of draws defined and a narrow enough interval).
    """
    out = []
    for j in range(values.shape[1]):
        col = values[:, j]
        defined = np.isfinite(col)
        share = float(defined.mean()) if len(col) else 0.0
        enough = defined.sum() >= MIN_INTERVAL_DRAWS
        ci = np.percentile(col[defined], [2.5, 97.5]).tolist() if enough else None
        value = float(point[j]) if np.isfinite(point[j]) else None
        reasons = [
            None if value is not None else f"{name} undefined at this compute (extrapolation)",
            None
            if share >= MIN_DEFINED
            else f"{name} defined in only {share:.0%} of draws (extrapolates in the rest)",
            verdict.ratio_reason(name, ci, decades),
        ]
        out.append(
            {
                "value": value,
                "ci": ci,
                "defined_share": share,
                "verdict": verdict.first_reason(*reasons),
            }
        )
    return out


def _surface_summary(arm: ArmOptima, point: np.ndarray, draws: np.ndarray) -> dict:
    names = ("E", "A", "alpha", "B", "beta")
    ok = np.all(np.isfinite(draws), axis=1)
    enough = ok.sum() >= MIN_INTERVAL_DRAWS
    ci = {
        name: np.percentile(draws[ok, i], [2.5, 97.5]).tolist() if enough else None
        for i, name in enumerate(names)
    }
    params = dict(zip(names, point.tolist(), strict=True))
    reasons = [
        None if np.all(np.isfinite(point)) else "no non-negative (E, A, B) on the exponent grid",
        None
        if enough
        else f"{int(ok.sum())} draws with a surface (an interval needs >= {MIN_INTERVAL_DRAWS})",
        *(verdict.exponent_reason(p, params[p], ci[p]) for p in ("alpha", "beta")),
    ]
    return {
        "form": "L = E + A N^-alpha + B D^-beta (least squares on loss, VPNLS grid)",
        "params": params,
        "ci": ci,
        "n_points": len(arm.loss),
        "verdict": verdict.first_reason(*reasons),
    }


def _curve_band(curves: np.ndarray) -> dict:
    lo, hi = [], []
    for col in curves.T:
        ok = np.isfinite(col)
        enough = ok.sum() >= MIN_INTERVAL_DRAWS
        pair = np.percentile(col[ok], [2.5, 97.5]) if enough else (np.nan, np.nan)
        lo.append(float(pair[0]))
        hi.append(float(pair[1]))
    return {"lo": lo, "hi": hi}


def arm_frontiers(arm: ArmOptima, route: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """(grid [g], point curve [g], draw curves [S, g], summary) of one arm's frontier by route."""
    grid = np.exp(np.linspace(*np.log(arm.compute_range), BASE_GRID))
    if route == "surface":
        point_params = fit_surfaces(arm.n, arm.d, arm.loss[None])
        draw_params = fit_surfaces(arm.n, arm.d, arm.draws)
        point = surface_frontier(point_params, arm, grid)[0]
        curves = surface_frontier(draw_params, arm, grid)
        summary = {"surface": _surface_summary(arm, point_params[0], draw_params)}
    else:
        point = envelope_frontier(arm, arm.loss[None], grid)[0]
        curves = envelope_frontier(arm, arm.draws, grid)
        summary = {"pareto_points": int(_pareto_count(arm))}
    band = _curve_band(curves[:, :: BASE_GRID // 16])
    summary["curve"] = {
        "compute": grid[:: BASE_GRID // 16].tolist(),
        "loss": point[:: BASE_GRID // 16].tolist(),
        **band,
    }
    return grid, point, curves, summary


def _pareto_count(arm: ArmOptima) -> int:
    best = np.minimum.accumulate(arm.loss[np.argsort(arm.compute)])
    return int(1 + np.sum(best[1:] < best[:-1]))


def route_skip_reason(arm: ArmOptima, route: str) -> str | None:
    if route == "surface":
        if len(arm.loss) < MIN_SURFACE_POINTS:
            return f"{arm.name}: {len(arm.loss)} identified cells (a surface needs >= 6)"
        if len(np.unique(arm.n)) < 3 or len(np.unique(arm.d)) < 2:
            return f"{arm.name}: a surface needs >= 3 sizes and >= 2 budgets among identified cells"
    elif len(np.unique(arm.compute)) < 2:
        return f"{arm.name}: an envelope needs >= 2 identified cells at distinct compute"
    return None


def compare_arms(arms: dict[str, ArmOptima], baseline: str, decades: float) -> dict:
    """Both routes' frontiers per arm and M(C) of every other arm over `baseline`.

    Returns:
        {"routes": {route: {"arms": {name: summary}, "multiplier": {new: [per C]}} | {"skipped"}},
         "compute": the common grid, "agreement": {new: [per C]}, "headline": {new: ...}}.
    """
    others = sorted(set(arms) - {baseline})
    at = common_grid(list(arms.values()))
    out: dict = {"baseline": baseline, "routes": {}}
    if at is None:
        out["skipped"] = "the arms' compute ranges do not overlap"
        return out
    out["compute"] = at.tolist()
    for route in ("surface", "envelope"):
        reasons = [r for r in (route_skip_reason(a, route) for a in arms.values()) if r]
        if reasons:
            out["routes"][route] = {"skipped": "; ".join(reasons)}
            continue
        curves = {name: arm_frontiers(arm, route) for name, arm in arms.items()}
        grid_b, point_b, draws_b, _ = curves[baseline]
        result = {"arms": {name: c[3] for name, c in curves.items()}, "multiplier": {}}
        for new in others:
            grid_n, point_n, draws_n, _ = curves[new]
            at_point = np.interp(np.log(at), np.log(grid_n), point_n)
            at_draws = np.array([np.interp(np.log(at), np.log(grid_n), row) for row in draws_n])
            m_point = multiplier(point_b[None], grid_b, at_point[None], at)[0]
            m_draws = multiplier(draws_b, grid_b, at_draws, at)
            result["multiplier"][new] = summarise(m_draws, m_point, "M(C)", decades)
        out["routes"][route] = result
    out["agreement"] = {new: _agreement(out["routes"], new) for new in others}
    return out


def _agreement(routes: dict, new: str) -> list[dict]:
    """Per compute value: both routes' M, their ratio, and whether their intervals overlap."""
    surface = routes.get("surface", {}).get("multiplier", {}).get(new)
    envelope = routes.get("envelope", {}).get("multiplier", {}).get(new)
    if surface is None or envelope is None:
        return []
    out = []
    for s, e in zip(surface, envelope, strict=True):
        if s["value"] is None or e["value"] is None or not s["ci"] or not e["ci"]:
            out.append({"status": "not comparable (a route is undefined here)"})
            continue
        overlap = s["ci"][0] <= e["ci"][1] and e["ci"][0] <= s["ci"][1]
        out.append(
            {
                "surface_over_envelope": s["value"] / e["value"],
                "status": "agree (intervals overlap)" if overlap else "disagree",
            }
        )
    return out
