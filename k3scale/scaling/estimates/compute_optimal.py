"""Compute-optimal frontiers of an arm and the compute multiplier between arms (methods.md 2.1-2.6).

A frontier is never fitted through every cell optimum: a cell that another cell beats at lower
compute is not on it. Two routes, side by side:

- "surface" (Chinchilla Approach 3): fit L(N, D) = E + A N^-alpha + B D^-beta to the arm's cell
  optima, then L*(C) = min over N of L(N, C / k(N)) with N and D kept inside the data's ranges
  (k(N) = FLOPs per token under the convention in use, interpolated over the arm's rungs);
- "envelope" (Approach 1): the Pareto points of the cell optima in (C, L), with the frontier law
  L*(C) = E + K C^-alpha fitted through them (methods.md 2.1 (b)); it assumes only that law,
  not a surface in (N, D).

The multiplier M(C) = C_base(L*_new(C)) / C (the baseline compute that matches the new arm's loss
at C) is read only inside the compute range both arms cover, and only where the new arm's loss
lies inside the baseline frontier's own range (no extrapolation). Every route is evaluated on the
draws of the cell optima (k3scale/scaling/estimates/optimum.py), so its percentile interval carries the
tuning and run noise of every cell; each draw refits the surface.

The surface is `surface.fit_surface_grid` (variable projection on an exponent grid, every draw
at once). It does not depend on the FLOP convention, so a study fits it once per arm
(`fit_arm_surfaces`) and reads it under each convention.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.stats import chi2

from k3scale.scaling.laws.frontier import (
    fit_frontier_grid,
    multiplier,
    predict_frontier_grid,
    record_lows,
)
from k3scale.scaling.laws.surface import fit_surface_grid
from k3scale.scaling.values import verdict
from k3scale.scaling.values.checks import budgets_per_size_reason, surface_design_reason
from k3scale.scaling.values.fitdoc import ArmFrontier, Comparison, Curve, Route, SurfaceRecord
from k3scale.scaling.values.uncertainty import (
    MIN_INTERVAL_DRAWS,
    Estimate,
    percentile_band,
    percentile_interval,
    robust_normal_interval,
)
from k3scale.scaling.values.verdict import Verdict

N_GRID = 64
C_GRID = 9
BASE_GRID = 128
# A frontier's stored curve: this many points of its BASE_GRID, both ends included.
CURVE_POINTS = 17
ROUTES = ("surface", "envelope")
# The surface route reads each size at this many token budgets (tokens-per-parameter ratios):
# with two, the D term of every size rests on one difference and its exponent on none
# (issue 33: the v2 designs' condition number was about 2e6).
MIN_BUDGETS_PER_SIZE = 3
SURFACE_PARAMS = ("E", "A", "alpha", "B", "beta")


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


def _distinct_computes(compute: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order sorting the cells by compute, first sorted index of each distinct compute, their
    log computes).

    Cells whose computes tie (a grid where N x D repeats, equal only to rounding) are one
    compute: the best of them is the frontier's point there. Left apart, rounding decided their
    order, and so which of them the Pareto rule kept (3.19 for a true 2.5 on AVX-512).
    """
    order = np.argsort(compute)
    log_c = np.log(compute[order])
    starts = np.flatnonzero(np.concatenate([[True], np.diff(log_c) > COMPUTE_TIE_LOG]))
    return order, starts, log_c[starts]


def envelope_law(arm: ArmOptima, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(params [S, 3], log_c): the frontier law E + K C^-alpha fitted through each row of
    `losses` [S, k]'s Pareto points (`fit_frontier_grid`), and the arm's distinct log computes it
    was fitted on (read it with `predict_frontier_grid`, invert it with `frontier_grid_log_compute`)."""
    order, starts, log_c = _distinct_computes(arm.compute)
    rows = np.minimum.reduceat(losses[:, order], starts, axis=1)
    keep = np.array([record_lows(row) for row in rows])
    return fit_frontier_grid(log_c, rows, keep), log_c


def _outside(log_c: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Mask of the log computes `targets` outside the arm's range `log_c` (no extrapolation)."""
    return (targets < log_c[0] - 1e-12) | (targets > log_c[-1] + 1e-12)


def envelope_frontier(arm: ArmOptima, losses: np.ndarray, compute: np.ndarray) -> np.ndarray:
    """L*(C) [S, m]: the frontier law E + K C^-alpha fitted through each row's Pareto points.

    Straight chords between the Pareto points lay M(C) in a zigzag around the truth between
    them (0.95-1.04 for no effect on the cpu_v3 k2_vs_k3 ladder, noise free), which no number of
    seeds removes and which raised the no-effect false-positive rate; the law through the same
    points gives 0.995-0.996 there. NaN outside the arm's compute range and for rows with fewer
    than 3 Pareto points.
    """
    params, log_c = envelope_law(arm, losses)
    targets = np.log(compute)
    out = predict_frontier_grid(params, log_c, targets)
    out[:, _outside(log_c, targets)] = np.nan
    return out


def pareto_count(arm: ArmOptima) -> int:
    """How many distinct computes carry a Pareto point of the arm's point estimates."""
    order, starts, _ = _distinct_computes(arm.compute)
    return int(record_lows(np.minimum.reduceat(arm.loss[order], starts)).sum())


def common_grid(arms: list[ArmOptima]) -> np.ndarray | None:
    """C_GRID log-spaced compute values across the range every arm covers, or None."""
    lo = max(a.compute_range[0] for a in arms)
    hi = min(a.compute_range[1] for a in arms)
    if not lo < hi:
        return None
    return np.exp(np.linspace(np.log(lo), np.log(hi), C_GRID))


def summarise(values: np.ndarray, point: np.ndarray, name: str, decades: float) -> list[Estimate]:
    """Per compute value: point, 95% percentile interval over defined draws, defined share and
    verdict (identified only with >= verdict.MIN_DEFINED of draws defined and a narrow enough
    interval).
    """
    out = []
    for j in range(values.shape[1]):
        col = values[:, j]
        share = float(np.isfinite(col).mean()) if len(col) else 0.0
        ci = percentile_interval(col)
        value = float(point[j]) if np.isfinite(point[j]) else None
        ruling = Verdict.first(
            None if value is not None else f"{name} undefined at this compute (extrapolation)",
            verdict.defined_share_reason(name, share),
            verdict.ratio_reason(name, ci, decades),
        )
        out.append(Estimate(value, ci, ruling, defined_share=share))
    return out


# A rate is a slope: it needs M(C) identified at this many compute values.
MIN_RATE_POINTS = 3


def log_slope(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """[S] least-squares slopes of log values [S, m] on log at [m] (NaN where a value is not)."""
    x = np.log(at) - np.log(at).mean()
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.log(values)
    return (y - y.mean(axis=1, keepdims=True)) @ x / (x @ x)


def rate_interval(slopes: np.ndarray, point: float) -> list[float] | None:
    """The rate's 95% interval: the hull of its draws' percentile interval and a normal one with
    the draws' robust spread.

    Neither alone holds in both studies' simulations (`bench calibrate`, v2 noise, no effect):
    on the cpu_v3 cosine-vs-WSD design the rate's errors have a heavier, differently skewed low
    tail than its draws (studentized 2.5/97.5% quantiles -2.24/+1.76 over 1500 studies), so the
    percentile interval excludes a zero rate in 8.1% of them; on the k2-vs-k3 design the draws'
    skew is right and the symmetric interval excludes it in 7.6% (of 1000). The hull excludes
    it in 5.2% and 4.9%, at 4-8% more width.
    """
    pct = percentile_interval(slopes)
    normal = robust_normal_interval(slopes, point)
    if pct is None or normal is None:
        return None
    return [min(pct[0], normal[0]), max(pct[1], normal[1])]


def rate_of(
    m_draws: np.ndarray, m_point: np.ndarray, at: np.ndarray, estimates: list[Estimate]
) -> Estimate:
    """d log M / d log C: the slope of log M(C) on log C over the compute values where M(C) is
    identified, at the point estimates and in every draw (methods.md 4.10).

    Positive: the advantage grows with compute; negative: it shrinks. A draw contributes only
    where M is defined at every one of those compute values.
    """
    used = np.array([e.identified for e in estimates])
    if used.sum() < MIN_RATE_POINTS:
        reason = (
            f"M(C) identified at {int(used.sum())} compute values "
            f"(a rate needs >= {MIN_RATE_POINTS})"
        )
        return Estimate(None, None, Verdict(reason))
    slopes = log_slope(m_draws[:, used], at[used])
    share = float(np.isfinite(slopes).mean())
    value = float(log_slope(m_point[used][None], at[used])[0])
    ci = rate_interval(slopes, value)
    ruling = Verdict.first(
        verdict.defined_share_reason("the rate", share),
        None if ci is not None else "the rate has no interval",
    )
    return Estimate(value, ci, ruling, defined_share=share)


def _inherit(estimates: list[Estimate], reason: str | None) -> list[Estimate]:
    """The estimates with `reason` as their verdict (a route whose own fit is not identified
    identifies none of what it gives), except where they are undefined, the plainer reason."""
    if reason is None:
        return estimates
    return [
        e if e.value is None else dataclasses.replace(e, verdict=Verdict(reason)) for e in estimates
    ]


def _surface_reason(frontiers: dict[str, RouteFrontier]) -> str | None:
    """Why the surface route cannot identify M(C): an arm whose surface is not identified."""
    for name, f in sorted(frontiers.items()):
        surface = f.record.surface
        if surface is not None and not surface.verdict.identified:
            return f"the surface of {name} is not identified ({surface.verdict.reason})"
    return None


@dataclasses.dataclass(frozen=True)
class SurfaceDraws:
    """An arm's surface fitted to its point estimates [5] and to every draw [S, 5] (NaN rows
    where no grid pair fits), parameters in SURFACE_PARAMS order."""

    point: np.ndarray
    draws: np.ndarray


def fit_arm_surface(arm: ArmOptima) -> SurfaceDraws:
    return SurfaceDraws(
        point=fit_surface_grid(arm.n, arm.d, arm.loss[None])[0],
        draws=fit_surface_grid(arm.n, arm.d, arm.draws),
    )


# The separable surface is rejected when it misses the cell optima beyond their noise at this
# level (methods.md 4.10).
LACK_OF_FIT_LEVEL = 0.01


def lack_of_fit_reason(arm: ArmOptima, params: np.ndarray) -> str | None:
    """Why the surface `params` does not describe the arm's cell optima, or None: a chi-square
    of its residuals on k - 5 degrees of freedom, each scaled by the variance of that optimum's
    draws, which carry the seed effects (methods.md 4.8). The part of the draws every cell
    shares (the seeds' common effect, their mean over cells) is taken out first: a shift of
    every optimum moves E alone and misfits nothing.

    K2's cpu_v2 optima, for one, gain more from doubling D the larger N is (issue 33): no
    L(N, D) with separate N and D terms has that shape.
    """
    dof = len(arm.loss) - len(SURFACE_PARAMS)
    if dof < 1 or len(arm.draws) < MIN_INTERVAL_DRAWS or not np.all(np.isfinite(params)):
        return None
    own = arm.draws - arm.draws.mean(axis=1, keepdims=True)
    variance = own.var(axis=0, ddof=1)
    if not np.all(variance > 0):
        return None
    e, a, alpha, b, beta = params
    fitted = e + a * arm.n**-alpha + b * arm.d**-beta
    statistic = float(np.sum((arm.loss - fitted) ** 2 / variance))
    p_value = float(chi2.sf(statistic, dof))
    if p_value >= LACK_OF_FIT_LEVEL:
        return None
    return (
        "the separable surface misses the cell optima beyond their noise "
        f"(chi-square {statistic:.3g} on {dof} df, p = {p_value:.2g})"
    )


def _surface_record(arm: ArmOptima, fit: SurfaceDraws) -> SurfaceRecord:
    ok = np.all(np.isfinite(fit.draws), axis=1)
    ci = {name: percentile_interval(fit.draws[ok, i]) for i, name in enumerate(SURFACE_PARAMS)}
    params = dict(zip(SURFACE_PARAMS, fit.point.tolist(), strict=True))
    ruling = Verdict.first(
        None
        if np.all(np.isfinite(fit.point))
        else "no non-negative (E, A, B) on the exponent grid",
        None
        if ci["E"] is not None
        else f"{int(ok.sum())} draws with a surface (an interval needs >= {MIN_INTERVAL_DRAWS})",
        *(verdict.exponent_reason(p, params[p], ci[p]) for p in ("alpha", "beta")),
        lack_of_fit_reason(arm, fit.point),
    )
    return SurfaceRecord(
        params=params,
        intervals=ci,
        verdict=ruling,
        n_points=len(arm.loss),
        form="L = E + A N^-alpha + B D^-beta (least squares on loss, VPNLS grid)",
    )


@dataclasses.dataclass(frozen=True)
class RouteFrontier:
    """One arm's frontier by one route: L*(C) on a BASE_GRID-point compute grid over the arm's
    range, at the point estimates [g] and at every draw [S, g], and the record the artifact
    keeps of it."""

    grid: np.ndarray
    point: np.ndarray
    draws: np.ndarray
    record: ArmFrontier

    def at(self, compute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(point [m], draws [S, m]) interpolated in log C at `compute`."""
        log_grid, log_at = np.log(self.grid), np.log(compute)
        point = np.interp(log_at, log_grid, self.point)
        return point, np.array([np.interp(log_at, log_grid, row) for row in self.draws])


def arm_frontier(arm: ArmOptima, route: str, surface: SurfaceDraws | None = None) -> RouteFrontier:
    """The arm's frontier by `route`; the surface route uses `surface` (fitted here if None)."""
    grid = np.exp(np.linspace(*np.log(arm.compute_range), BASE_GRID))
    shown = np.linspace(0, BASE_GRID - 1, CURVE_POINTS).round().astype(int)
    if route == "surface":
        surface = surface or fit_arm_surface(arm)
        point = surface_frontier(surface.point[None], arm, grid)[0]
        curves = surface_frontier(surface.draws, arm, grid)
        extra = {"surface": _surface_record(arm, surface)}
    else:
        point = envelope_frontier(arm, arm.loss[None], grid)[0]
        curves = envelope_frontier(arm, arm.draws, grid)
        extra = {"pareto_points": pareto_count(arm)}
    band = percentile_band(curves[:, shown])
    curve = Curve(
        compute=tuple(grid[shown].tolist()),
        loss=tuple(None if np.isnan(v) else float(v) for v in point[shown]),
        lo=tuple(None if np.isnan(v) else v for v in band["lo"]),
        hi=tuple(None if np.isnan(v) else v for v in band["hi"]),
    )
    return RouteFrontier(grid, point, curves, ArmFrontier(curve, **extra))


def route_skip_reason(arm: ArmOptima, route: str) -> str | None:
    if route == "surface":
        reason = surface_design_reason(arm.n, arm.d) or budgets_per_size_reason(
            arm.n, arm.d, MIN_BUDGETS_PER_SIZE
        )
        return f"{arm.name}: {reason} among identified cells" if reason else None
    if len(np.unique(arm.compute)) < 3:
        return f"{arm.name}: an envelope needs >= 3 identified cells at distinct compute"
    return None


def compare_arms(
    arms: dict[str, ArmOptima],
    baseline: str,
    decades: float,
    surfaces: dict[str, SurfaceDraws] | None = None,
) -> Comparison:
    """Both routes' frontiers per arm and M(C) of every other arm over `baseline`.

    surfaces: each arm's fitted surface when the caller has it (fitted here otherwise).
    """
    others = sorted(set(arms) - {baseline})
    at = common_grid(list(arms.values()))
    if at is None:
        return Comparison(baseline, skipped="the arms' compute ranges do not overlap")
    routes = {}
    for route in ROUTES:
        reasons = [r for r in (route_skip_reason(a, route) for a in arms.values()) if r]
        if reasons:
            routes[route] = Route({}, {}, skipped="; ".join(reasons))
            continue
        frontiers = {
            name: arm_frontier(arm, route, (surfaces or {}).get(name)) for name, arm in arms.items()
        }
        base = frontiers[baseline]
        unidentified = _surface_reason(frontiers) if route == "surface" else None
        ratios, rates = {}, {}
        for new in others:
            point, draws = frontiers[new].at(at)
            m_point = multiplier(base.point[None], base.grid, point[None], at)[0]
            m_draws = multiplier(base.draws, base.grid, draws, at)
            ratios[new] = _inherit(summarise(m_draws, m_point, "M(C)", decades), unidentified)
            rates[new] = rate_of(m_draws, m_point, at, ratios[new])
        routes[route] = Route({name: f.record for name, f in frontiers.items()}, ratios, rates)
    return Comparison(baseline, tuple(at.tolist()), routes)
