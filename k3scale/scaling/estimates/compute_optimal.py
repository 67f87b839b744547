"""Compute-optimal frontiers of an arm and the compute multiplier between arms (methods.md 2.1-2.6).

A frontier is never fitted through every cell optimum: a cell that another cell beats at lower
compute is not on it. Two routes, side by side:

- "surface" (Chinchilla Approach 3): fit L(N, D) = E + A N^-alpha + B D^-beta to the arm's cell
  optima, then L*(C) = min over N of L(N, C / k(N)) with N and D kept inside the data's ranges
  (k(N) = FLOPs per token under the convention in use, interpolated over the arm's rungs);
- "envelope" (Approach 1): the Pareto points of the cell optima in (C, L), with the frontier law
  L*(C) = E + K C^-alpha fitted through them (methods.md 2.1 (b)); it assumes only that law,
  not a surface in (N, D);
- "envelope_e0": the same law with its asymptote pinned at E = 0 (a pure power law), reported
  beside the free one (issue 47);
- "monotone": no functional form: the running minimum of the cell optima in log C, interpolated
  by a monotone cubic (methods.md 4.11 (b)); its M(C) interval bounds what any non-increasing
  frontier through those minima allows between cells (`monotone_multiplier_bounds`), and its
  rate is the slope of the cubic's reading.

A route signs nothing its own checks reject (methods.md 4.11 (a)): the surface and both laws
are tested for lack of fit against the optima's noise, and a law whose exponent sits on an end
of its search grid, or whose free asymptote is negative or above the lowest point it was fitted
to, is refused with its reason.

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
from scipy.interpolate import PchipInterpolator
from scipy.stats import chi2

from k3scale.scaling.laws.frontier import (
    exponent_on_bound,
    fit_frontier_grid,
    multiplier,
    predict_frontier_grid,
    record_lows,
)
from k3scale.scaling.laws.surface import fit_surface_grid
from k3scale.scaling.values import verdict
from k3scale.scaling.values.checks import budgets_per_size_reason, surface_design_reason
from k3scale.scaling.values.fitdoc import (
    ArmFrontier,
    Comparison,
    Curve,
    LackOfFit,
    LawRecord,
    Route,
    SurfaceRecord,
)
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
ROUTES = ("surface", "envelope", "envelope_e0", "monotone")
# The frontier-law routes and the asymptote each pins (None: E is fitted).
LAW_ROUTES = {"envelope": None, "envelope_e0": 0.0}
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


def distinct_computes(compute: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def _pareto_rows(arm: ArmOptima, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows [S, P], keep [S, P], log_c [P]): each row of `losses` [S, k] as its best loss per
    distinct compute, which of those are Pareto points, and the distinct log computes."""
    order, starts, log_c = distinct_computes(arm.compute)
    rows = np.minimum.reduceat(losses[:, order], starts, axis=1)
    keep = np.array([record_lows(row) for row in rows])
    return rows, keep, log_c


def envelope_law(
    arm: ArmOptima, losses: np.ndarray, pinned_e: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(params [S, 3], log_c): the frontier law E + K C^-alpha fitted through each row of
    `losses` [S, k]'s Pareto points (`fit_frontier_grid`, E fixed at `pinned_e` if given), and
    the arm's distinct log computes it was fitted on (read it with `predict_frontier_grid`,
    invert it with `frontier_grid_log_compute`)."""
    rows, keep, log_c = _pareto_rows(arm, losses)
    return fit_frontier_grid(log_c, rows, keep, pinned_e), log_c


def _outside(log_c: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Mask of the log computes `targets` outside the arm's range `log_c` (no extrapolation)."""
    return (targets < log_c[0] - 1e-12) | (targets > log_c[-1] + 1e-12)


def envelope_frontier(
    arm: ArmOptima, losses: np.ndarray, compute: np.ndarray, pinned_e: float | None = None
) -> np.ndarray:
    """L*(C) [S, m]: the frontier law E + K C^-alpha fitted through each row's Pareto points.

    Straight chords between the Pareto points lay M(C) in a zigzag around the truth between
    them (0.95-1.04 for no effect on the cpu_v3 k2_vs_k3 ladder, noise free), which no number of
    seeds removes and which raised the no-effect false-positive rate; the law through the same
    points gives 0.995-0.996 there. NaN outside the arm's compute range and for rows with fewer
    than 3 Pareto points.
    """
    params, log_c = envelope_law(arm, losses, pinned_e)
    targets = np.log(compute)
    out = predict_frontier_grid(params, log_c, targets)
    out[:, _outside(log_c, targets)] = np.nan
    return out


def running_minima(arm: ArmOptima, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log C [k] of the arm's distinct computes, [S, k] the lowest loss of any cell at that
    compute or below): the running minimum, non-increasing in C."""
    order, starts, log_c = distinct_computes(arm.compute)
    rows = np.minimum.reduceat(losses[:, order], starts, axis=1)
    return log_c, np.minimum.accumulate(rows, axis=1)


def monotone_frontier(arm: ArmOptima, losses: np.ndarray, compute: np.ndarray) -> np.ndarray:
    """L*(C) [S, m] assuming no form: the running minimum of the cell optima, joined by a
    monotone cubic in log C.

    The running minimum is a continuous function of the optima, so the curve does not jump when
    a cell enters or leaves the Pareto set (the law through the Pareto points does: issue 47
    saw M move from 2.20 to 1.86 as k2-s3 at 10 tokens per parameter left K2's set); the
    monotone cubic keeps it non-increasing and bends with a convex frontier where straight
    chords would lie above it. NaN outside the arm's compute range.
    """
    log_c, running = running_minima(arm, losses)
    if len(log_c) < 2:
        return np.full((len(losses), len(compute)), np.nan)
    curve = PchipInterpolator(log_c, running, axis=1, extrapolate=False)(np.log(compute))
    return np.asarray(curve, dtype=np.float64)


@dataclasses.dataclass(frozen=True)
class MultiplierBounds:
    """[S, m] bounds on M(C) that hold for any non-increasing frontiers through the arms' running
    minima (NaN where a bound would need a frontier outside an arm's compute range)."""

    lower: np.ndarray
    upper: np.ndarray


def monotone_multiplier_bounds(
    base: ArmOptima, new: ArmOptima, base_losses: np.ndarray, new_losses: np.ndarray, at: np.ndarray
) -> MultiplierBounds:
    """What M(C) can be between cells when the frontier has no form (issue 47).

    A non-increasing frontier that meets each running minimum r_j at its compute c_j lies, at
    c_j < C < c_j+1, anywhere in [r_j+1, r_j]. The monotone cubic picks one curve in that band,
    and calibration (`bench calibrate`, v3 design, no effect) found its M(C) excluding 1 in 22%
    of studies: two ladders sampled at different computes interpolate differently. The bounds
    take the whole band instead: the baseline needs at most the first compute whose running
    minimum reaches the new arm's lowest possible loss at C, and more than the compute before
    the first one that reaches its highest.
    """
    base_c, base_r = running_minima(base, base_losses)
    new_c, new_r = running_minima(new, new_losses)
    log_at = np.log(at)
    left = np.clip(np.searchsorted(new_c, log_at, side="right") - 1, 0, len(new_c) - 1)
    right = np.clip(np.searchsorted(new_c, log_at, side="left"), 0, len(new_c) - 1)
    highest, lowest = new_r[:, left], new_r[:, right]  # [S, m] the new arm's band at C

    def reached(target: np.ndarray) -> np.ndarray:
        """[S, m] index of the first baseline compute whose running minimum is <= target."""
        return (base_r[:, :, None] > target[:, None, :]).sum(axis=1)

    first_low, first_high = reached(lowest), reached(highest)
    k = len(base_c)
    upper = np.where(first_low < k, np.exp(base_c[np.minimum(first_low, k - 1)]) / at, np.nan)
    lower = np.where(first_high >= 1, np.exp(base_c[np.maximum(first_high - 1, 0)]) / at, np.nan)
    return MultiplierBounds(lower, upper)


def bounded_estimates(
    point: np.ndarray, bounds: MultiplierBounds, name: str, decades: float
) -> list[Estimate]:
    """Per compute value: the point reading with the 95% interval of the bounds (the lower
    bound's 2.5th percentile to the upper bound's 97.5th), identified as `summarise` says."""
    out = []
    for j in range(point.shape[0]):
        lo, hi = bounds.lower[:, j], bounds.upper[:, j]
        share = float(min(np.isfinite(lo).mean(), np.isfinite(hi).mean())) if len(lo) else 0.0
        low, high = percentile_interval(lo), percentile_interval(hi)
        ci = [low[0], high[1]] if low and high else None
        value = float(point[j]) if np.isfinite(point[j]) else None
        ruling = Verdict.first(
            None if value is not None else f"{name} undefined at this compute (extrapolation)",
            verdict.defined_share_reason(f"a bound on {name}", share),
            verdict.ratio_reason(name, ci, decades),
        )
        out.append(Estimate(value, ci, ruling, defined_share=share))
    return out


def pareto_count(arm: ArmOptima) -> int:
    """How many distinct computes carry a Pareto point of the arm's point estimates."""
    order, starts, _ = distinct_computes(arm.compute)
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


def _route_reason(route: str, frontiers: dict[str, RouteFrontier]) -> str | None:
    """Why `route` cannot identify M(C): an arm whose surface or frontier law its own checks
    refuse (the monotone route assumes no form and has nothing to refuse)."""
    for name, f in sorted(frontiers.items()):
        surface, law = f.record.surface, f.record.law
        if surface is not None and not surface.verdict.identified:
            return f"the surface of {name} is not identified ({surface.verdict.reason})"
        if law is not None and not law.verdict.identified:
            return f"the frontier law of {name} is refused ({law.verdict.reason})"
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


# A fitted law is rejected when it misses the points it was fitted to beyond their noise at this
# level (methods.md 4.10, 4.11).
LACK_OF_FIT_LEVEL = 0.01
# Draws spread less than this (nats) do not vary: a noise-free truth, whose optima still carry
# the quadratic fits' rounding.
NOISE_FREE_SD = 1e-6


def _own_variance(arm: ArmOptima) -> np.ndarray:
    """[k] variance of each cell optimum's draws less the part every cell shares (the seeds'
    common effect, their mean over cells): a shift of every optimum moves E alone and misfits
    nothing."""
    own = arm.draws - arm.draws.mean(axis=1, keepdims=True)
    return own.var(axis=0, ddof=1)


def lack_of_fit(
    residuals: np.ndarray, variance: np.ndarray, dof: int, what: str, points: str
) -> tuple[LackOfFit | None, str | None]:
    """(the test, why it rejects or None): a chi-square of `residuals` each scaled by its
    point's draw variance (which carries the seed effects, methods.md 4.8) on `dof` degrees of
    freedom. Without a degree of freedom, or with draws that do not vary (noise-free optima: a
    truth, not a study), there is nothing to test: no test (None) and nothing rejected; the
    record keeps `lack_of_fit` None, so a reader sees the fit went untested."""
    if dof < 1 or not np.all(variance > NOISE_FREE_SD**2):
        return None, None
    statistic = float(np.sum(residuals**2 / variance))
    test = LackOfFit(statistic, dof, float(chi2.sf(statistic, dof)))
    if test.p_value >= LACK_OF_FIT_LEVEL:
        return test, None
    return test, (
        f"{what} misses {points} beyond their noise "
        f"(chi-square {statistic:.3g} on {dof} df, p = {test.p_value:.2g})"
    )


def surface_lack_of_fit(arm: ArmOptima, params: np.ndarray) -> tuple[LackOfFit | None, str | None]:
    """The separable surface against the arm's cell optima, on k - 5 degrees of freedom.

    K2's cpu_v2 optima, for one, gain more from doubling D the larger N is (issue 33): no
    L(N, D) with separate N and D terms has that shape.
    """
    dof = len(arm.loss) - len(SURFACE_PARAMS)
    if dof < 1 or len(arm.draws) < MIN_INTERVAL_DRAWS or not np.all(np.isfinite(params)):
        return None, None
    e, a, alpha, b, beta = params
    fitted = e + a * arm.n**-alpha + b * arm.d**-beta
    return lack_of_fit(
        arm.loss - fitted, _own_variance(arm), dof, "the separable surface", "the cell optima"
    )


def lack_of_fit_reason(arm: ArmOptima, params: np.ndarray) -> str | None:
    """Why the surface `params` does not describe the arm's cell optima, or None."""
    return surface_lack_of_fit(arm, params)[1]


def _surface_record(arm: ArmOptima, fit: SurfaceDraws) -> SurfaceRecord:
    ok = np.all(np.isfinite(fit.draws), axis=1)
    ci = {name: percentile_interval(fit.draws[ok, i]) for i, name in enumerate(SURFACE_PARAMS)}
    params = dict(zip(SURFACE_PARAMS, fit.point.tolist(), strict=True))
    test, misfit = surface_lack_of_fit(arm, fit.point)
    ruling = Verdict.first(
        None
        if np.all(np.isfinite(fit.point))
        else "no non-negative (E, A, B) on the exponent grid",
        None
        if ci["E"] is not None
        else f"{int(ok.sum())} draws with a surface (an interval needs >= {MIN_INTERVAL_DRAWS})",
        *(verdict.exponent_reason(p, params[p], ci[p]) for p in ("alpha", "beta")),
        misfit,
    )
    return SurfaceRecord(
        params=params,
        intervals=ci,
        verdict=ruling,
        n_points=len(arm.loss),
        form="L = E + A N^-alpha + B D^-beta (least squares on loss, VPNLS grid)",
        lack_of_fit=test,
        draws=fit.draws,
        n_range=(float(arm.n.min()), float(arm.n.max())),
        d_range=(float(arm.d.min()), float(arm.d.max())),
    )


def law_record(arm: ArmOptima, pinned_e: float | None) -> LawRecord:
    """The frontier law through the arm's Pareto points, its draws, and its checks: a refusal
    when its exponent sits on an end of the search grid, its free asymptote is negative or not
    below the lowest Pareto loss, or it misses the Pareto points beyond their noise (issue 47:
    on k2_vs_k3 cpu_v3 K2's law reached alpha = 0.005, E = -27, chi-square about 345 on 5 df)."""
    rows, keep, log_c = _pareto_rows(arm, arm.loss[None])
    point = fit_frontier_grid(log_c, rows, keep, pinned_e)[0]
    draws = envelope_law(arm, arm.draws, pinned_e)[0]
    on = keep[0]
    order, starts, _ = distinct_computes(arm.compute)
    # Each distinct compute's best cell carries its variance (ties are one compute).
    best = [order[a + int(np.argmin(arm.loss[order[a:b]]))] for a, b in _spans(starts, len(order))]
    variance = _own_variance(arm)[best][on]
    fitted = predict_frontier_grid(point[None], log_c, log_c[on])[0]
    dof = int(on.sum()) - (3 if pinned_e is None else 2)
    name = "the frontier law" + ("" if pinned_e is None else f" with E pinned at {pinned_e:g}")
    test, misfit = (
        lack_of_fit(rows[0][on] - fitted, variance, dof, name, "its Pareto points")
        if np.all(np.isfinite(point))
        else (None, None)
    )
    e, _, alpha = point
    lowest = float(rows[0][on].min())
    ruling = Verdict.first(
        None if np.all(np.isfinite(point)) else "no decreasing law through the Pareto points",
        f"its exponent alpha = {alpha:.3g} sits on an end of its search grid"
        if np.isfinite(alpha) and exponent_on_bound(alpha)
        else None,
        f"its asymptote E = {e:.3g} nats is negative"
        if pinned_e is None and np.isfinite(e) and e < 0
        else None,
        f"its asymptote E = {e:.3g} is not below the lowest Pareto loss {lowest:.3g}"
        if pinned_e is None and np.isfinite(e) and e >= lowest
        else None,
        misfit,
    )
    return LawRecord(
        form="L = E + K (C / C_ref)^-alpha through the Pareto points (least squares on loss)",
        pinned_e=pinned_e,
        params={"E": float(e), "K": float(point[1]), "alpha": float(alpha)},
        log_c_ref=float(log_c.mean()),
        compute_range=(float(np.exp(log_c[0])), float(np.exp(log_c[-1]))),
        verdict=ruling,
        points=int(on.sum()),
        lack_of_fit=test,
        draws=draws,
    )


def _spans(starts: np.ndarray, total: int) -> list[tuple[int, int]]:
    """[(start, end)] of each run of tied computes from `_distinct_computes`' starts."""
    ends = [*starts[1:].tolist(), total]
    return list(zip(starts.tolist(), ends, strict=True))


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


def _route_curves(
    arm: ArmOptima, route: str, grid: np.ndarray, surface: SurfaceDraws | None
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(point [g], draws [S, g], the ArmFrontier fields) of one route on `grid`."""
    if route == "surface":
        surface = surface or fit_arm_surface(arm)
        point = surface_frontier(surface.point[None], arm, grid)[0]
        curves = surface_frontier(surface.draws, arm, grid)
        return point, curves, {"surface": _surface_record(arm, surface)}
    extra = {"pareto_points": pareto_count(arm)}
    if route == "monotone":
        point = monotone_frontier(arm, arm.loss[None], grid)[0]
        return point, monotone_frontier(arm, arm.draws, grid), extra
    pinned = LAW_ROUTES[route]
    point = envelope_frontier(arm, arm.loss[None], grid, pinned)[0]
    curves = envelope_frontier(arm, arm.draws, grid, pinned)
    return point, curves, {**extra, "law": law_record(arm, pinned)}


def arm_frontier(arm: ArmOptima, route: str, surface: SurfaceDraws | None = None) -> RouteFrontier:
    """The arm's frontier by `route`; the surface route uses `surface` (fitted here if None)."""
    grid = np.exp(np.linspace(*np.log(arm.compute_range), BASE_GRID))
    shown = np.linspace(0, BASE_GRID - 1, CURVE_POINTS).round().astype(int)
    point, curves, extra = _route_curves(arm, route, grid, surface)
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
    """Every route's frontiers per arm and M(C) of every other arm over `baseline`.

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
        refused = _route_reason(route, frontiers)
        ratios, rates, rate_at = {}, {}, {}
        for new in others:
            point, draws = frontiers[new].at(at)
            m_point = multiplier(base.point[None], base.grid, point[None], at)[0]
            m_draws = multiplier(base.draws, base.grid, draws, at)
            read = summarise(m_draws, m_point, "M(C)", decades)
            if route == "monotone":
                bounds = monotone_multiplier_bounds(
                    arms[baseline], arms[new], arms[baseline].draws, arms[new].draws, at
                )
                ratios[new] = bounded_estimates(m_point, bounds, "M(C)", decades)
            else:
                ratios[new] = _inherit(read, refused)
            # The rate is the slope of the route's reading (for the monotone route, of its
            # cubic), over the compute values where that reading is identified.
            rates[new] = (
                Estimate(None, None, Verdict(refused))
                if refused
                else rate_of(m_draws, m_point, at, read)
            )
            rate_at[new] = tuple(at[[e.identified for e in read]].tolist())
        routes[route] = Route(
            {name: f.record for name, f in frontiers.items()}, ratios, rates, rate_at=rate_at
        )
    return Comparison(baseline, tuple(at.tolist()), routes)
