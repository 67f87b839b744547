"""Compare frontiers of several groups (architectures, schedules) against a baseline.

Per group: L(C) = E + A C^-alpha (Huber on log residuals). Between groups: M(C) at stated compute
values, crossovers, and the shared-exponent test with its single multiplier k. Intervals come from
a bootstrap that resamples points within each group independently (methods.md 2.6).
"""

from __future__ import annotations

import functools

import numpy as np

from k3scale.errors import K3ScaleError
from k3scale.scaling import frontier, verdict
from k3scale.scaling.bootstrap import run_bootstrap
from k3scale.scaling.multiplier import (
    REJECT_LEVEL,
    crossovers,
    fit_shared_exponent,
    multiplier_at,
    shared_exponent_test,
)
from k3scale.scaling.objective import HUBER_DELTA


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


def _refit(c, y, g, *, num_groups, at, warm, log_c_refs, delta) -> np.ndarray:
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
        out.extend(multiplier_at(fits[0], fit, at))
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
        "crossovers": {name: [C...]}}.
    """
    c, y = frontier.check_inputs(compute, loss, "frontier comparison")
    code, names = _group_codes(groups, baseline)
    for i, name in enumerate(names):
        members = code == i
        if len(np.unique(c[members])) < 3:
            raise K3ScaleError(
                f"frontier comparison: group {name!r} needs at least 3 distinct "
                f"compute values (sizes/budgets), got {len(np.unique(c[members]))}"
            )
    fits = [
        frontier.fit_frontier(c[code == i], y[code == i], delta=delta, units=units)
        for i in range(len(names))
    ]
    for name, fit in zip(names, fits, strict=True):
        if not fit.params:
            raise K3ScaleError(f"frontier comparison: group {name!r}: {fit.message}")
    at = (
        np.array(sorted(at))
        if at is not None
        else np.exp(np.linspace(np.log(c.min()), np.log(c.max()), 3))
    )
    lo_data, hi_data = c.min(), c.max()
    multipliers = []
    for i in range(1, len(names)):
        values = multiplier_at(fits[0].params, fits[i].params, at)
        multipliers.extend(
            {
                "compute": float(cv),
                "group": names[i],
                "value": float(v),
                "extrapolated": bool(cv < lo_data or cv > hi_data),
                "ci": None,
            }
            for cv, v in zip(at, values, strict=True)
        )
    warm = [np.array(f.extra["warm_starts"]) for f in fits]
    test = shared_exponent_test(c, y, code, len(names), starts=warm)
    out = {
        "baseline": baseline,
        "groups": {
            name: {
                **fit.params,
                "success": fit.success,
                "message": fit.message,
                "n_points": fit.n_points,
                "ci": {},
            }
            for name, fit in zip(names, fits, strict=True)
        },
        "multiplier": multipliers,
        "shared_exponent": _shared_summary(test, names),
        "crossovers": {
            names[i]: crossovers(fits[0].params, fits[i].params, lo_data / 10, hi_data * 10)
            for i in range(1, len(names))
        },
        "data_compute_range": [float(lo_data), float(hi_data)],
        "units": units or frontier.DEFAULT_UNITS,
    }
    if num_resamples > 0:
        _add_intervals(out, c, y, code, names, fits, at, num_resamples, seed, workers, delta)
    return out


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


def _add_intervals(out, c, y, code, names, fits, at, num_resamples, seed, workers, delta) -> None:
    num_groups = len(names)
    warm = [np.array(f.extra["warm_starts"]) for f in fits]
    refs = [f.extra["log_c_ref"] for f in fits]
    refit = functools.partial(
        _refit, num_groups=num_groups, at=at, warm=warm, log_c_refs=refs, delta=delta
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
    intervals = draws.intervals()
    for name in names:
        out["groups"][name]["ci"] = {p: intervals[f"{name}.{p}"] for p in frontier.PARAM_NAMES}
    for entry in out["multiplier"]:
        i = int(np.flatnonzero(at == entry["compute"])[0])
        entry["ci"] = intervals[f"M.{entry['group']}.{i}"]
        entry["verdict"] = verdict.first_reason(
            "extrapolated past the data" if entry["extrapolated"] else None,
            None if np.isfinite(entry["value"]) else "M(C) undefined (a fitted floor above a loss)",
            verdict.ratio_reason("M(C)", entry["ci"], verdict.MULTIPLIER_DECADES),
        )
    for name in names:
        group = out["groups"][name]
        group["verdict"] = verdict.first_reason(
            None if group["success"] else group["message"] or "fit failed",
            verdict.exponent_reason("alpha", group["alpha"], group["ci"].get("alpha")),
        )
    shared = out["shared_exponent"]
    shared["fitted_multiplier_ci"] = {n: intervals[f"k.{n}"] for n in names[1:]}
    if shared.get("multiplier") is not None:
        shared["ci"] = intervals[f"k.{names[1]}"]
    out["bootstrap"] = draws.summary()
