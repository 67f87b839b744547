"""Laws as predictors (issue 47 item 3): what a fit artifact says about runs it has not seen.

From a `k3scale fit` artifact, for each arm:

- the frontier loss L*(C) at any compute, by each frontier-law route (E free and E pinned), with
  a 95% interval for a new run on a new seed: the law's stored draws plus that run's own noise
  (its within-cell spread and a new seed's study-wide effect, both measured from the re-runs);
- the optimum loss of a cell (N, D), by the arm's surface and by a log-linear response surface
  in (log N, log D) with their interaction (the shape K2's v3 optima need: they gain more from
  D the larger N is), each refitted on every draw of the cell optima it was fitted to;
- the compute-optimal N and D at C (from the surface, under 6ND);
- the tuned peak LR (and batch, where the study searched it) from a law log lr = a + b log N +
  c log D across the cells, with its prediction interval;
- M(C) of every other arm over the baseline by each law route, beyond the data as well.

Every prediction carries its route's verdict (a refused law still predicts, for the record of how
a refused law fares, and says it is refused), the factor by which it extrapolates beyond the
largest compute the law was fitted on, and whether a larger run exists to check it is the
caller's to say (Marin's "prediction" vs "projection").
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.stats import chi2, norm
from scipy.stats import t as t_dist

from k3scale.errors import K3ScaleError
from k3scale.scaling.laws.frontier import frontier_grid_log_compute, predict_frontier_grid
from k3scale.scaling.values.fitdoc import (
    CellOptimumRecord,
    Comparison,
    LawRecord,
    SurfaceRecord,
    read_cell_optima,
    read_comparisons,
)
from k3scale.scaling.values.uncertainty import LEVEL, percentile_interval
from k3scale.scaling.values.verdict import Verdict

LAW_ROUTES = ("envelope", "envelope_e0")
LACK_OF_FIT_LEVEL = 0.01
Z95 = float(norm.ppf(1 - (1 - LEVEL) / 2))
# Draws of a new run's own noise added to each law draw (fixed seed: a prediction reproduces).
NOISE_DRAWS = 10
NOISE_SEED = 0


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One predicted number: point, 95% interval, the route's verdict, and how far it reaches
    beyond the compute its law was fitted on (C / largest fitted C; <= 1 inside)."""

    value: float | None
    interval: list[float] | None
    verdict: Verdict
    extrapolation: float | None = None

    def to_json(self) -> dict:
        return {
            "value": self.value,
            "interval": self.interval,
            "verdict": self.verdict.to_json(),
            "extrapolation": self.extrapolation,
        }

    @classmethod
    def from_json(cls, doc: dict) -> Prediction:
        return cls(
            doc["value"], doc["interval"], Verdict.from_json(doc["verdict"]), doc["extrapolation"]
        )


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def new_run_sd(results: dict) -> float:
    """The sd of one new run around a cell's expected optimum on a new seed: its within-cell
    spread (run noise plus the seed's effect on that cell) and a new seed's study-wide effect."""
    seeds = results.get("run_noise", {}).get("seed_effects")
    if seeds:
        return float(np.hypot(seeds["cell_sd"], seeds["shared_sd"]))
    sd = results.get("run_noise", {}).get("sd")
    if sd is None:
        raise K3ScaleError("the fit measured no run noise: a new run's interval cannot be given")
    return float(sd)


def _with_noise(draws: np.ndarray, sd: float) -> np.ndarray:
    """Each draw [S] of an expected loss plus NOISE_DRAWS draws of a new run's noise."""
    noise = np.random.default_rng(NOISE_SEED).normal(0.0, sd, (len(draws), NOISE_DRAWS))
    return (draws[:, None] + noise).ravel()


def law_loss(law: LawRecord, compute: float, sd: float) -> Prediction:
    """L*(C) by a frontier law, with the interval of a new run at the frontier."""
    log_c = np.array([law.log_c_ref])  # the law's reference compute is the mean of its points
    at = np.array([np.log(compute)])
    point_params = np.array([[law.params["E"], law.params["K"], law.params["alpha"]]])
    point = predict_frontier_grid(point_params, log_c, at)[0, 0]
    draws = predict_frontier_grid(law.draws, log_c, at)[:, 0]
    return Prediction(
        _finite(point),
        percentile_interval(_with_noise(draws[np.isfinite(draws)], sd)),
        law.verdict,
        compute / law.compute_range[1],
    )


def surface_loss(surface: SurfaceRecord, n: float, d: float, sd: float) -> Prediction:
    """A cell's optimum loss L(N, D) by the arm's surface, as a new run would read it."""
    p = surface.params
    point = p["E"] + p["A"] * n ** -p["alpha"] + p["B"] * d ** -p["beta"]
    e, a, alpha, b, beta = surface.draws.T
    draws = e + a * n**-alpha + b * d**-beta
    reach = max(n / surface.n_range[1], d / surface.d_range[1])
    return Prediction(
        _finite(point),
        percentile_interval(_with_noise(draws[np.isfinite(draws)], sd)),
        surface.verdict,
        reach,
    )


def compute_optimal_allocation(surface: SurfaceRecord, compute: float) -> dict[str, Prediction]:
    """N* and D* at C = 6 N D from the surface (methods.md 2.4): G = (alpha A / (beta B))^(1 /
    (alpha + beta)), N* = G (C / 6)^(beta / (alpha + beta)), D* = C / (6 N*)."""

    def n_star(e, a, alpha, b, beta):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            g = (alpha * a / (beta * b)) ** (1 / (alpha + beta))
            return g * (compute / 6) ** (beta / (alpha + beta))

    p = surface.params
    point = float(n_star(p["E"], p["A"], p["alpha"], p["B"], p["beta"]))
    draws = n_star(*surface.draws.T)
    draws = draws[np.isfinite(draws) & (draws > 0)]
    reach = compute / (6 * surface.n_range[1] * surface.d_range[1])
    ci = percentile_interval(np.log(draws))
    n_ci = None if ci is None else np.exp(ci).tolist()
    d_ci = None if ci is None else (compute / 6 / np.exp(ci[::-1])).tolist()
    return {
        "N": Prediction(_finite(point), n_ci, surface.verdict, reach),
        "D": Prediction(_finite(compute / 6 / point), d_ci, surface.verdict, reach),
    }


@dataclasses.dataclass(frozen=True)
class LogLinear:
    """Least squares of y on the columns of x [k, p] (a constant added), and what a new point's
    prediction interval needs: coefficients, (X'X)^-1, residual variance and its df."""

    coef: np.ndarray
    inverse: np.ndarray
    residual_var: float
    dof: int

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray) -> LogLinear:
        design = np.column_stack([np.ones(len(y)), x])
        dof = len(y) - design.shape[1]
        if dof < 1 or np.linalg.matrix_rank(design) < design.shape[1]:
            raise K3ScaleError(
                f"a log-linear law in {x.shape[1]} regressors needs more than "
                f"{design.shape[1]} cells that vary in each, got {len(y)}"
            )
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        residual = y - design @ coef
        return cls(coef, np.linalg.inv(design.T @ design), float(residual @ residual / dof), dof)

    def predict(self, x0: np.ndarray, level: float = LEVEL) -> tuple[float, list[float]]:
        """(point, prediction interval) for a new observation at x0 [p]."""
        row = np.concatenate([[1.0], x0])
        point = float(row @ self.coef)
        se = np.sqrt(self.residual_var * (1 + row @ self.inverse @ row))
        half = float(t_dist.ppf(1 - (1 - level) / 2, self.dof) * se)
        return point, [point - half, point + half]


def _log_nd(n: float, d: float) -> np.ndarray:
    return np.array([np.log(n), np.log(d)])


def hp_prediction(
    optima: list[CellOptimumRecord], target: str, n: float, d: float, reach: float
) -> Prediction:
    """The tuned `target` ("lr_opt" or "batch_opt") at (N, D) from log target = a + b log N +
    c log D over the identified cells, with its prediction interval (a new cell's optimum
    scatters around the law as the fitted cells do)."""
    ok = [o for o in optima if o.loss.identified]
    values = np.array([getattr(o, target) for o in ok])
    if len(np.unique(values)) < 2:
        why = f"{target} is the same in every cell (fixed, not searched)"
        return Prediction(float(values[0]) if len(values) else None, None, Verdict(why), reach)
    x = np.array([_log_nd(o.n, o.tokens) for o in ok])
    try:
        law = LogLinear.fit(x, np.log(values))
    except K3ScaleError as exc:
        return Prediction(None, None, Verdict(str(exc)), reach)
    point, ci = law.predict(_log_nd(n, d))
    return Prediction(float(np.exp(point)), np.exp(ci).tolist(), Verdict(), reach)


def _cell_features(n, d) -> np.ndarray:
    """[k, 3] log N, log D and their product: the log-linear response surface's regressors."""
    x, y = np.log(np.asarray(n, float)), np.log(np.asarray(d, float))
    return np.column_stack([x, y, x * y])


def loglinear_loss(
    optima: list[CellOptimumRecord], n: float, d: float, sd: float, reach: float
) -> Prediction:
    """A cell's optimum loss from L = a + b log N + c log D + g log N log D, least squares over
    the arm's cell optima.

    Its interval: the coefficients' sandwich variance with each optimum's own variance (from
    its 95% interval; the optima are levelled to their seeds, so what they still share is a
    new seed's effect, which the new run's sd carries), plus a new run's noise. Its lack-of-fit
    test: the residuals' chi-square against those variances on k - 4 df, at the 1% level.
    """
    x = _cell_features([o.n for o in optima], [o.tokens for o in optima])
    y = np.array([o.loss.value for o in optima])
    try:
        law = LogLinear.fit(x, y)
    except K3ScaleError as exc:
        return Prediction(None, None, Verdict(str(exc)), reach)
    design = np.column_stack([np.ones(len(y)), x])
    variance = np.array(
        [((o.loss.interval[1] - o.loss.interval[0]) / (2 * Z95)) ** 2 for o in optima]
    )
    residual = y - design @ law.coef
    statistic = float(np.sum(residual**2 / variance))
    p_value = float(chi2.sf(statistic, law.dof))
    row = np.concatenate([[1.0], _cell_features([n], [d])[0]])
    spread = law.inverse @ design.T
    coef_var = spread @ np.diag(variance) @ spread.T
    point = float(row @ law.coef)
    half = Z95 * float(np.sqrt(row @ coef_var @ row + sd**2))
    ruling = Verdict.first(
        f"the log-linear surface misses its cells beyond their noise (chi-square "
        f"{statistic:.3g} on {law.dof} df, p = {p_value:.2g})"
        if p_value < LACK_OF_FIT_LEVEL
        else None
    )
    return Prediction(point, [point - half, point + half], ruling, reach)


def law_multiplier(base: LawRecord, new: LawRecord, compute: float) -> Prediction:
    """M(C) = C_base(L_new(C)) / C from two frontier laws, beyond the data as well: the new
    arm's law read at C, the baseline's law inverted there. Refused if either law is."""
    at = np.array([np.log(compute)])

    def m_of(base_params, new_params):
        loss = predict_frontier_grid(new_params, np.array([new.log_c_ref]), at)[:, 0]
        log_base = frontier_grid_log_compute(base_params, np.array([base.log_c_ref]), loss)
        return np.exp(log_base - np.log(compute))

    point = m_of(_params(base)[None], _params(new)[None])[0]
    count = min(len(base.draws), len(new.draws))
    draws = m_of(base.draws[:count], new.draws[:count])
    ci = percentile_interval(np.log(draws[np.isfinite(draws) & (draws > 0)]))
    ruling = Verdict.first(
        None
        if base.verdict.identified
        else f"the baseline's law is refused ({base.verdict.reason})",
        None if new.verdict.identified else f"the new arm's law is refused ({new.verdict.reason})",
    )
    reach = compute / min(base.compute_range[1], new.compute_range[1])
    return Prediction(_finite(point), None if ci is None else np.exp(ci).tolist(), ruling, reach)


def _params(law: LawRecord) -> np.ndarray:
    return np.array([law.params["E"], law.params["K"], law.params["alpha"]])


@dataclasses.dataclass(frozen=True)
class ArmLaws:
    """An arm's stored predictors under one FLOP convention."""

    laws: dict[str, LawRecord]
    surface: SurfaceRecord | None
    optima: list[CellOptimumRecord]


def arm_laws(doc: dict, conv: str) -> tuple[Comparison, dict[str, ArmLaws]]:
    """Every arm's laws under `conv` from a fit artifact (one with a compute-optimal
    comparison: k2_vs_k3, or the schedules of cosine_vs_wsd)."""
    results = doc.get("results", {})
    comparison = read_comparisons(results).get(conv)
    if comparison is None or comparison.skipped:
        why = comparison.skipped if comparison else f"no compute-optimal comparison under {conv}"
        raise K3ScaleError(f"the fit has no laws to predict from ({why})")
    group = _group_key(comparison, results)
    optima = read_cell_optima(results)
    out = {}
    for arm in sorted({a for r in comparison.routes.values() for a in r.arms}):
        laws = {
            route: comparison.routes[route].arms[arm].law
            for route in LAW_ROUTES
            if route in comparison.routes and arm in comparison.routes[route].arms
        }
        surface_route = comparison.routes.get("surface")
        surface = (
            surface_route.arms[arm].surface if surface_route and arm in surface_route.arms else None
        )
        mine = [o for o in optima if o.cell[group] == arm and o.loss.identified]
        out[arm] = ArmLaws(laws, surface, mine)
    return comparison, out


def _group_key(comparison: Comparison, results: dict) -> str:
    """The cell field the comparison's arms are named by ("arch" or "schedule")."""
    names = {a for r in comparison.routes.values() for a in r.arms}
    for key in ("arch", "schedule"):
        if names and names <= {o["cell"][key] for o in results.get("cell_optima", [])}:
            return key
    raise K3ScaleError("the comparison's arms match no cell field of the fit")


@dataclasses.dataclass(frozen=True)
class CellQuery:
    """A cell to predict: the arm, its N (the study's N column) and its training tokens D."""

    arm: str
    n: float
    d: float


def forecast(doc: dict, computes: list[float], cells: list[CellQuery], conv: str) -> dict:
    """Every prediction the artifact supports at `computes` (each arm's frontier, allocation and
    M(C)) and at `cells` (optimum loss and tuned LR and batch), as JSON-ready records."""
    comparison, arms = arm_laws(doc, conv)
    unknown = sorted({c.arm for c in cells} - set(arms))
    if unknown:
        raise K3ScaleError(f"no arm {', '.join(unknown)} in the fit (it has {sorted(arms)})")
    sd = new_run_sd(doc.get("results", {}))
    out: dict = {"conv": conv, "new_run_sd": sd, "arms": {}, "multiplier": {}}
    for name, arm in arms.items():
        frontier = [
            {"compute": c, **{r: law_loss(law, c, sd).to_json() for r, law in arm.laws.items()}}
            for c in computes
        ]
        allocation = (
            [
                {
                    "compute": c,
                    **{
                        k: p.to_json()
                        for k, p in compute_optimal_allocation(arm.surface, c).items()
                    },
                }
                for c in computes
            ]
            if arm.surface is not None and arm.surface.draws is not None and conv == "c_6n"
            else []
        )
        out["arms"][name] = {
            "frontier": frontier,
            "allocation": allocation,
            "cells": [_cell_record(arm, q, sd) for q in cells if q.arm == name],
        }
    for new in comparison.others:
        out["multiplier"][new] = [
            {
                "compute": c,
                **{
                    route: law_multiplier(
                        arms[comparison.baseline].laws[route], arms[new].laws[route], c
                    ).to_json()
                    for route in arms[new].laws
                    if route in arms[comparison.baseline].laws
                },
            }
            for c in computes
        ]
    out["baseline"] = comparison.baseline
    return out


def _cell_record(arm: ArmLaws, q: CellQuery, sd: float) -> dict:
    n_max = max(o.n for o in arm.optima)
    d_max = max(o.tokens for o in arm.optima)
    reach = max(q.n / n_max, q.d / d_max)
    loss = {"loglinear": loglinear_loss(arm.optima, q.n, q.d, sd, reach).to_json()}
    if arm.surface is not None and arm.surface.draws is not None:
        loss["surface"] = surface_loss(arm.surface, q.n, q.d, sd).to_json()
    return {
        "n": q.n,
        "d": q.d,
        "loss": loss,
        "lr_opt": hp_prediction(arm.optima, "lr_opt", q.n, q.d, reach).to_json(),
        "batch_opt": hp_prediction(arm.optima, "batch_opt", q.n, q.d, reach).to_json(),
    }
