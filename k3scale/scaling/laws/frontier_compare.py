"""Compare the fitted frontiers of several groups (architectures, schedules) with a baseline's.

Per group: L(C) = E + A C^-alpha (`frontier.fit_frontier`, Huber on log residuals). Between
groups (methods.md 2.6):

- Matched compute: `M(C) = C_base(L_new(C)) / C`, the factor of extra compute the baseline needs
  to reach the loss the new group reaches with C. The baseline's fitted L(C) is evaluated on a
  dense log-spaced grid and inverted by `frontier.multiplier`, the one M(C) inversion of
  k3scale/scaling; undefined (NaN) where L_new(C) is at or below the baseline's floor E.
  Crossovers are where M(C) = 1.
- Shared-exponent model: `L = E + A (k_g C)^-alpha` with E, A, alpha shared and k_base = 1, so
  k_new is one multiplier. Tested against separate frontiers (free E, A, alpha per group) with an
  F-test on log residuals, both nested models fitted by least squares on log L.

Intervals come from a bootstrap that resamples points within each group independently.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from scipy.optimize import minimize
from scipy.stats import f as f_dist

from k3scale.errors import K3ScaleError
from k3scale.scaling.laws import frontier
from k3scale.scaling.laws.bootstrap import BootstrapDraws, run_bootstrap
from k3scale.scaling.laws.objective import HUBER_DELTA, FitOptions, single_threaded_blas
from k3scale.scaling.values import verdict
from k3scale.scaling.values.result import FitResult
from k3scale.scaling.values.verdict import Verdict

# Conventional 5% level for "rejected" (the p-value itself is always reported).
REJECT_LEVEL = 0.05
# The baseline's L(C) is inverted on a grid this dense: linear interpolation of log C between
# grid losses errs by at most alpha h^2 / 8 in log M, h = ln(10) / INVERSION_POINTS_PER_DECADE,
# so 1.3e-6 relative at alpha = 2 (the largest exponent a fit accepts, verdict.EXPONENT_BOUNDS)
# and 2e-7 at a typical 0.3 (tests/scaling/laws/test_frontier_compare.py measures it).
INVERSION_POINTS_PER_DECADE = 1000
# ... and reaches this many decades past the data and the compute asked about on either side,
# so any M(C) in [1e-10, 1e10] is found. A bootstrap draw further out (M = 6.6e11 occurred, in
# the tail of an interval 3 decades wide) is undefined, as one below E is, and leaves the interval.
INVERSION_MARGIN_DECADES = 10
# The nested models of the F-test are fitted by least squares on log L.
LEAST_SQUARES = FitOptions(delta=None)
# Crossovers are looked for up to this factor beyond the data's compute on either side.
CROSSOVER_REACH = 10.0


def inversion_grid(*computes) -> np.ndarray:
    """[g] log-spaced FLOPs spanning every array in `computes`, INVERSION_MARGIN_DECADES wider
    on each side, INVERSION_POINTS_PER_DECADE a decade."""
    lo = min(np.log10(np.min(c)) for c in computes) - INVERSION_MARGIN_DECADES
    hi = max(np.log10(np.max(c)) for c in computes) + INVERSION_MARGIN_DECADES
    return np.logspace(lo, hi, int(np.ceil((hi - lo) * INVERSION_POINTS_PER_DECADE)) + 1)


def frontier_multiplier(base: dict, new: dict, at, grid: np.ndarray) -> np.ndarray:
    """M(C) [m] at compute `at` [m] of two fitted frontiers {"E", "A", "alpha"}.

    The baseline's L(C) on `grid` [g] is inverted by `frontier.multiplier`: NaN where
    L_new(C) lies below every loss on it (the baseline's floor E, or a match beyond the grid).
    """
    at = np.asarray(at, dtype=np.float64)
    base_curve = frontier.predict_frontier(base, grid)[None]
    new_loss = frontier.predict_frontier(new, at)[None]
    return frontier.multiplier(base_curve, grid, new_loss, at)[0]


def _crossovers(base: dict, new: dict, grid: np.ndarray, lo: float, hi: float) -> list[float]:
    """Compute values in [lo, hi] where the frontiers cross: log M(C) changes sign between two
    grid points, placed by linear interpolation in log C."""
    c = grid[(grid >= lo) & (grid <= hi)]
    with np.errstate(invalid="ignore"):
        log_m = np.log(frontier_multiplier(base, new, c, grid))
    i = np.flatnonzero(log_m[:-1] * log_m[1:] < 0)
    share = log_m[i] / (log_m[i] - log_m[i + 1])
    log_c = np.log(c)
    return np.exp(log_c[i] + share * (log_c[i + 1] - log_c[i])).tolist()


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
    mid, grid = np.exp([log_c_ref]), inversion_grid(compute)
    m0 = np.array([frontier_multiplier(base, params, mid, grid)[0] for params in separate[1:]])
    log_k0 = np.where(np.isfinite(m0), np.log(m0), 0.0)
    best = None
    for shift in shifts:
        start = np.array([a0, base["alpha"], np.log(base["E"]), *(log_k0 + shift)])
        with single_threaded_blas(), np.errstate(all="ignore"):
            res = minimize(objective.value_and_grad, start, jac=True, method="BFGS")
        if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    params = frontier.frontier_params(best.x[:3], log_c_ref)
    return {**params, "k": [1.0, *np.exp(best.x[3:]).tolist()]}, 2.0 * float(best.fun)


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
        members = group == g
        fit = frontier.fit_frontier(
            compute[members], loss[members], starts=starts[g], options=LEAST_SQUARES
        )
        separate.append(fit.params)
        pred = frontier.predict_frontier(fit.params, compute[members])
        rss_sep += float(np.sum((np.log(loss[members]) - np.log(pred)) ** 2))
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


def _group_codes(groups, baseline: str) -> tuple[np.ndarray, list[str]]:
    names = [str(g) for g in groups]
    if baseline not in names:
        raise K3ScaleError(
            f"frontier comparison: baseline {baseline!r} not among groups {sorted(set(names))}"
        )
    order = [baseline, *sorted(set(names) - {baseline})]
    if len(order) < 2:
        raise K3ScaleError("frontier comparison: needs at least two groups")
    code = {name: i for i, name in enumerate(order)}
    return np.array([code[n] for n in names]), order


def _refit(c, y, g, *, num_groups, at, grid, warm, log_c_refs, delta) -> np.ndarray:
    """Bootstrap refit: [3G frontier params, (G-1)*m multipliers, (G-1) shared k]."""
    fits = []
    for i in range(num_groups):
        vec = frontier.refit_frontier_vector(
            c[g == i], y[g == i], starts=warm[i], log_c_ref=log_c_refs[i], delta=delta
        )
        fits.append(dict(zip(frontier.PARAM_NAMES, vec, strict=True)))
    out = [v for fit in fits for v in fit.values()]
    if any(not np.isfinite(list(f.values())).all() for f in fits):
        return np.full(3 * num_groups + (num_groups - 1) * (len(at) + 1), np.nan)
    for fit in fits[1:]:
        out.extend(frontier_multiplier(fits[0], fit, at, grid))
    shared, _ = fit_shared_exponent(c, y, g, num_groups, fits, shifts=(0.0,))
    out.extend(shared["k"][1:])
    return np.array(out, dtype=np.float64)


def compare_frontiers(
    compute,
    loss,
    groups,
    baseline: str,
    *,
    at=None,
    num_resamples: int = 0,
    seed: int = 0,
    workers: int = 1,
    delta: float | None = HUBER_DELTA,
    units: dict[str, str] | None = None,
) -> dict:
    """Fit each group's frontier and compare it with the baseline's.

    Args:
        compute: [n] FLOPs of each point (one convention for every group).
        loss: [n] loss of each point.
        groups: [n] group name of each point.
        baseline: the reference group (M = 1 by definition).
        at: compute values for M(C); default the smallest, geometric-middle and largest compute.
        num_resamples, seed, workers: bootstrap within each group (0 = no intervals).
        delta: Huber delta for the per-group fits.

    Returns:
        {"baseline", "groups": {name: {"E","A","alpha","ci","success","message","n_points"}},
        "multiplier": [{"compute","group","value","ci","extrapolated"}],
        "shared_exponent": {"p_value","rejected","multiplier","ci",...},
        "crossovers": {name: [C...]}, "data_compute_range", "units"}.
    """
    c, y = frontier.check_inputs(compute, loss, "frontier comparison")
    code, names = _group_codes(groups, baseline)
    fits = [
        _fit_group(c[code == i], y[code == i], name, delta, units) for i, name in enumerate(names)
    ]
    at = (
        np.array(sorted(at))
        if at is not None
        else np.exp(np.linspace(np.log(c.min()), np.log(c.max()), 3))
    )
    grid = inversion_grid(c, at)
    lo_data, hi_data = float(c.min()), float(c.max())
    base = fits[0].params
    warm = [np.array(f.extra["warm_starts"]) for f in fits]
    out = {
        "baseline": baseline,
        "groups": {name: _group_summary(fit) for name, fit in zip(names, fits, strict=True)},
        "multiplier": [
            _multiplier_entry(cv, names[i], v, (lo_data, hi_data))
            for i in range(1, len(names))
            for cv, v in zip(at, frontier_multiplier(base, fits[i].params, at, grid), strict=True)
        ],
        "shared_exponent": _shared_summary(
            shared_exponent_test(c, y, code, len(names), starts=warm), names
        ),
        "crossovers": {
            names[i]: _crossovers(
                base, fits[i].params, grid, lo_data / CROSSOVER_REACH, hi_data * CROSSOVER_REACH
            )
            for i in range(1, len(names))
        },
        "data_compute_range": [lo_data, hi_data],
        "units": units or frontier.DEFAULT_UNITS,
    }
    if num_resamples <= 0:
        return out
    refit = functools.partial(
        _refit,
        num_groups=len(names),
        at=at,
        grid=grid,
        warm=warm,
        log_c_refs=[f.extra["log_c_ref"] for f in fits],
        delta=delta,
    )
    labels = [f"{n}.{p}" for n in names for p in frontier.PARAM_NAMES]
    labels += [f"M.{n}.{i}" for n in names[1:] for i in range(len(at))]
    labels += [f"k.{n}" for n in names[1:]]
    draws = run_bootstrap(
        refit,
        [c, y, code],
        labels,
        num_resamples=num_resamples,
        seed=seed,
        workers=workers,
        strata=code,
        unit="points within each group",
    )
    _add_intervals(out, draws, names, at)
    out["bootstrap"] = draws.summary()
    return out


def _fit_group(c: np.ndarray, y: np.ndarray, name: str, delta, units) -> FitResult:
    if len(np.unique(c)) < 3:
        raise K3ScaleError(
            f"frontier comparison: group {name!r} needs at least 3 distinct "
            f"compute values (sizes/budgets), got {len(np.unique(c))}"
        )
    fit = frontier.fit_frontier(c, y, options=FitOptions(delta=delta), units=units)
    if not fit.params:
        raise K3ScaleError(f"frontier comparison: group {name!r}: {fit.message}")
    return fit


def _group_summary(fit: FitResult) -> dict:
    return {
        **fit.params,
        "success": fit.success,
        "message": fit.message,
        "n_points": fit.n_points,
        "ci": {},
    }


def _multiplier_entry(compute: float, group: str, value: float, data_range) -> dict:
    return {
        "compute": float(compute),
        "group": group,
        "value": float(value),
        "extrapolated": bool(compute < data_range[0] or compute > data_range[1]),
        "ci": None,
    }


def _shared_summary(test: dict, names: list[str]) -> dict:
    if test.get("p_value") is None:
        return {**test, "rejected": None, "multiplier": None, "ci": None}
    rejected = test["p_value"] < REJECT_LEVEL
    ks = test["shared_fit"]["k"]
    summary = {
        **test,
        "rejected": rejected,
        "level": REJECT_LEVEL,
        "fitted_multipliers": dict(zip(names[1:], ks[1:], strict=True)),
    }
    # A single multiplier is reported only where the shared exponent is not rejected.
    summary["multiplier"] = None if rejected or len(names) != 2 else ks[1]
    summary["ci"] = None
    return summary


def _add_intervals(out: dict, draws: BootstrapDraws, names: list[str], at: np.ndarray) -> None:
    """The bootstrap's intervals, and the verdicts they decide, into `out`."""
    intervals = draws.intervals()
    for name in names:
        group = out["groups"][name]
        group["ci"] = {p: intervals[f"{name}.{p}"] for p in frontier.PARAM_NAMES}
        group["verdict"] = Verdict.first(
            None if group["success"] else group["message"] or "fit failed",
            verdict.exponent_reason("alpha", group["alpha"], group["ci"].get("alpha")),
        ).to_json()
    for entry in out["multiplier"]:
        i = int(np.flatnonzero(at == entry["compute"])[0])
        label = f"M.{entry['group']}.{i}"
        entry["ci"] = intervals[label]
        entry["defined_share"] = draws.defined_share(label)
        entry["verdict"] = Verdict.first(
            "extrapolated past the data" if entry["extrapolated"] else None,
            None if np.isfinite(entry["value"]) else "M(C) undefined (a fitted floor above a loss)",
            verdict.defined_share_reason("M(C)", entry["defined_share"]),
            verdict.ratio_reason("M(C)", entry["ci"], verdict.MULTIPLIER_DECADES),
        ).to_json()
    shared = out["shared_exponent"]
    shared["fitted_multiplier_ci"] = {n: intervals[f"k.{n}"] for n in names[1:]}
    if shared.get("multiplier") is not None:
        shared["ci"] = intervals[f"k.{names[1]}"]
