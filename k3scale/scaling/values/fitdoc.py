"""The fit artifact's schema: the records `k3scale fit` writes and everything else reads back.

`fit.json` (version `SCHEMA_VERSION`) is
`{"analysis": recipe, "provenance": {...}, "results": {...}}`. Its `results` hold:

- `cell_optima`: one `CellOptimumRecord` per cell (every recipe);
- `schedule_comparison` (cosine_vs_wsd): a `ScheduleComparison`, cell by cell and pooled;
- `compute_optimal`: per FLOP convention, a `Comparison` of the arms' compute-optimal frontiers
  by two routes and M(C) over the baseline;
- `per_schedule` / `per_arch`: HP laws and IsoFLOP fits as `FitResult` dicts
  (k3scale/scaling/values/result.py), `{"skipped": why}` where the data cannot support them;
- `excluded`: the runs left out, by reason.

Every estimate is an `Estimate` (value, 95% interval, verdict). The estimators build these
records and write them with `to_json`; the report, the dashboards and the calibration bench read
them with `from_json` (or the `read_*` helpers), so no reader parses a verdict or guesses a shape.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from k3scale.scaling.values.result import FitResult
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.scaling.values.verdict import Verdict

# 1: first release. 2 (issue 32): one estimator per number: no first-generation frontiers,
# surfaces or backtests; a frontier's curve holds 17 points, both ends included. 3 (issue 33):
# each route holds the rate of M(C). 4 (issue 33): a pooled difference is paired (the mean of
# the cells' draws) and carries the t-interval over sizes as `across_sizes`. 5 (issue 47):
# the routes envelope_e0 and monotone; laws and surfaces keep their lack-of-fit tests and draws;
# agreement names the routes that pass.
SCHEMA_VERSION = 5


# The optima an HP law is fitted to (k3scale/scaling/study.py `hp_laws`).
HP_TARGETS = ("lr_opt", "batch_opt")


def _floats(values) -> tuple[float | None, ...]:
    return tuple(None if v is None else float(v) for v in values)


@dataclasses.dataclass(frozen=True)
class CellOptimumRecord:
    """One cell's fitted optimum (methods.md 4.7) as the artifact stores it.

    Attributes:
        cell: {arch, schedule, size, budget_tokens}.
        n, tokens: parameters (the study's N column) and training tokens.
        compute: FLOPs per convention ({"c_6n": ..., "c_attn": ...}).
        loss: the optimum loss with its interval and verdict.
        lr_opt, batch_opt: where the optimum sits (batch in the study's batch column).
        mode: the quadratic read ("2d", "1d+batch", "1d") or "best trial" without one.
        trials: tuning trials in the cell.
        best_trial: {lr, batch, loss, run_id} of the lowest-loss trial.
        seed_losses: losses of the seed re-runs at the best trial.
    """

    cell: dict
    n: float
    tokens: float
    compute: dict[str, float]
    loss: Estimate
    lr_opt: float
    batch_opt: float
    mode: str
    trials: int
    best_trial: dict
    seed_losses: list[float]

    def to_json(self) -> dict:
        ruling = self.loss.verdict.to_json()
        ci = self.loss.interval
        return {
            "cell": self.cell,
            "n": self.n,
            "tokens": self.tokens,
            **self.compute,
            "optimum": {
                "params": {
                    "lr_opt": self.lr_opt,
                    "batch_opt": self.batch_opt,
                    "loss_opt": self.loss.value,
                },
                "intervals": {"loss_opt": ci} if ci else {},
                "success": self.loss.identified,
                "message": "" if self.loss.identified else ruling,
                "mode": self.mode,
                "trials": self.trials,
            },
            "loss": self.loss.value,
            "loss_ci": ci,
            "verdict": ruling,
            "best_trial": self.best_trial,
            "seed_losses": self.seed_losses,
            "seed_sd": float(np.std(self.seed_losses, ddof=1))
            if len(self.seed_losses) > 1
            else None,
        }

    @classmethod
    def from_json(
        cls, doc: dict, computes: tuple[str, ...] = ("c_6n", "c_attn")
    ) -> CellOptimumRecord:
        opt = doc["optimum"]
        return cls(
            cell=doc["cell"],
            n=doc["n"],
            tokens=doc["tokens"],
            compute={c: doc[c] for c in computes if c in doc},
            loss=Estimate(doc["loss"], doc["loss_ci"], Verdict.from_json(doc["verdict"])),
            lr_opt=opt["params"]["lr_opt"],
            batch_opt=opt["params"]["batch_opt"],
            mode=opt["mode"],
            trials=opt["trials"],
            best_trial=doc["best_trial"],
            seed_losses=doc["seed_losses"],
        )


@dataclasses.dataclass(frozen=True)
class CellDifference:
    """Reference minus other schedule in one (arch, size, budget) cell: at each schedule's own
    optimum and at the reference's optimum (methods.md 3.4)."""

    cell: dict
    reference: str
    other: str
    own: Estimate
    shared: Estimate
    lr_ratio: float
    batch_ratio: float
    losses: dict[str, float]

    def to_json(self) -> dict:
        own, shared = self.own, self.shared
        return {
            "diff_own": own.value,
            "ci_own": own.interval,
            "verdict_own": own.verdict.to_json(),
            "sign_own": sign_text(own.interval, self.reference, self.other),
            "diff_shared": shared.value,
            "ci_shared": shared.interval,
            "verdict_shared": shared.verdict.to_json(),
            "sign_shared": sign_text(shared.interval, self.reference, self.other),
            "lr_ratio": self.lr_ratio,
            "batch_ratio": self.batch_ratio,
            "loss": self.losses,
        }

    @classmethod
    def from_json(cls, cell: dict, reference: str, other: str, doc: dict) -> CellDifference:
        return cls(
            cell=cell,
            reference=reference,
            other=other,
            own=Estimate(doc["diff_own"], doc["ci_own"], Verdict.from_json(doc["verdict_own"])),
            shared=Estimate(
                doc["diff_shared"], doc["ci_shared"], Verdict.from_json(doc["verdict_shared"])
            ),
            lr_ratio=doc["lr_ratio"],
            batch_ratio=doc["batch_ratio"],
            losses=doc["loss"],
        )


def sign_of(interval: list[float] | None, reference: str, other: str) -> str:
    """Which schedule a difference interval (reference minus other) says ends lower."""
    if not interval:
        return "no interval"
    lo, hi = interval
    if hi < 0:
        return f"{reference} lower"
    if lo > 0:
        return f"{other} lower"
    return "not resolved (interval contains 0)"


def sign_text(interval: list[float] | None, reference: str, other: str) -> str:
    return sign_of(interval, reference, other) if interval else "not identified"


@dataclasses.dataclass(frozen=True)
class PooledDifference:
    """The mean difference over identified cells, with its paired interval and a t-interval
    over clusters of cells.

    Attributes:
        cells, identified_cells, clusters: cells compared, those with an identified difference,
            and their independent clusters (arch and size).
        mean: the mean difference with its interval (from the cells' draws, paired by seed) and
            verdict.
        across_sizes: the same mean with a t-interval over clusters, which holds without the
            seed model (few degrees of freedom: a check, not the headline).
        point_signs: cells whose point difference favours each schedule.
        resolved_signs: cells by what their own interval says.
        consistent: every point sign the same and the interval excludes 0.
        selection_free: the mean of the differences at matched seeds on the re-runs at each
            schedule's chosen point, the tuning seed left out, with a t-interval over the pairs
            (None: no identified cell has such re-runs). The tuning seed chose the points, so
            `mean` carries the selection's luck and this is the reading to sign (issue 47).
        pairs, pair_cells: the paired re-runs behind `selection_free` and the cells they sit in.
        pair_signs: pairs whose difference favours each schedule.
    """

    cells: int
    identified_cells: int
    clusters: int
    mean: Estimate
    across_sizes: Estimate | None = None
    point_signs: dict[str, int] = dataclasses.field(default_factory=dict)
    resolved_signs: dict[str, int] = dataclasses.field(default_factory=dict)
    consistent: bool = False
    method: str = (
        "percentile interval of the mean over cells of their draws (paired: draws share each "
        "seed's effects)"
    )
    selection_free: Estimate | None = None
    pairs: int = 0
    pair_cells: int = 0
    pair_signs: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_json(self, reference: str, other: str) -> dict:
        out = {
            "cells": self.cells,
            "identified_cells": self.identified_cells,
            "clusters": self.clusters,
            "verdict": self.mean.verdict.to_json(),
        }
        free = self.selection_free
        if free is not None:
            out["selection_free"] = {
                **free.to_json(),
                "sign": sign_text(free.interval, reference, other),
                "pairs": self.pairs,
                "cells": self.pair_cells,
                "signs": self.pair_signs,
            }
        if not self.mean.identified:
            return out
        return {
            **out,
            "mean_diff": self.mean.value,
            "ci": self.mean.interval,
            "method": self.method,
            "sign": sign_of(self.mean.interval, reference, other),
            "across_sizes": self.across_sizes.to_json() if self.across_sizes else None,
            "point_signs": self.point_signs,
            "resolved_signs": self.resolved_signs,
            "consistent": self.consistent,
        }

    @classmethod
    def from_json(cls, doc: dict) -> PooledDifference:
        # Artifacts before issue 47 have no selection-free reading.
        free = doc.get("selection_free") or {}
        return cls(
            cells=doc["cells"],
            identified_cells=doc["identified_cells"],
            clusters=doc["clusters"],
            mean=Estimate(doc.get("mean_diff"), doc.get("ci"), Verdict.from_json(doc["verdict"])),
            across_sizes=Estimate.from_json(doc["across_sizes"])
            if doc.get("across_sizes")
            else None,
            point_signs=doc.get("point_signs", {}),
            resolved_signs=doc.get("resolved_signs", {}),
            consistent=doc.get("consistent", False),
            selection_free=Estimate.from_json(free) if free else None,
            pairs=free.get("pairs", 0),
            pair_cells=free.get("cells", 0),
            pair_signs=free.get("signs", {}),
        )


@dataclasses.dataclass(frozen=True)
class ScheduleComparison:
    """Every schedule against the reference, cell by cell and pooled, with the run noise."""

    reference: str
    cells: list[CellDifference]
    pooled: dict[str, PooledDifference]
    run_noise: dict

    def to_json(self) -> dict:
        by_cell: dict[tuple, dict] = {}
        for d in self.cells:
            key = tuple(sorted(d.cell.items()))
            entry = by_cell.setdefault(key, {"cell": d.cell, "comparison": {}})
            entry["comparison"][d.other] = d.to_json()
        return {
            "reference": self.reference,
            "diff": "L_reference - L_other (negative: reference lower)",
            "cells": list(by_cell.values()),
            "pooled": {o: p.to_json(self.reference, o) for o, p in self.pooled.items()},
            "run_noise": self.run_noise,
        }

    @classmethod
    def from_json(cls, doc: dict) -> ScheduleComparison:
        reference = doc["reference"]
        return cls(
            reference=reference,
            cells=[
                CellDifference.from_json(entry["cell"], reference, other, part)
                for entry in doc["cells"]
                for other, part in entry["comparison"].items()
            ],
            pooled={o: PooledDifference.from_json(p) for o, p in doc["pooled"].items()},
            run_noise=doc.get("run_noise", {}),
        )


@dataclasses.dataclass(frozen=True)
class Curve:
    """A frontier L*(C) at the point estimates with its 95% band (None where undefined)."""

    compute: tuple[float, ...]
    loss: tuple[float | None, ...]
    lo: tuple[float | None, ...]
    hi: tuple[float | None, ...]

    def to_json(self) -> dict:
        return {
            "compute": list(self.compute),
            "loss": list(self.loss),
            "lo": list(self.lo),
            "hi": list(self.hi),
        }

    @classmethod
    def from_json(cls, doc: dict) -> Curve:
        return cls(*(_floats(doc[k]) for k in ("compute", "loss", "lo", "hi")))


# A law keeps this many of its bootstrap draws (the first: they are exchangeable), as one list
# per parameter at DRAW_DIGITS significant digits: enough for a predictive interval's 2.5%
# tails (10 draws beyond each), at about a third of the artifact's size with all 1000.
STORED_DRAWS = 400
DRAW_DIGITS = 7


def draws_to_json(draws: np.ndarray, names: tuple[str, ...]) -> dict[str, list[float | None]]:
    """[S, p] draws as {name: [STORED_DRAWS rounded floats, None for NaN]}."""
    kept = np.asarray(draws, dtype=np.float64)[:STORED_DRAWS]
    return {
        name: [None if not np.isfinite(v) else float(f"{v:.{DRAW_DIGITS}g}") for v in column]
        for name, column in zip(names, kept.T, strict=True)
    }


def draws_from_json(doc: dict[str, list], names: tuple[str, ...]) -> np.ndarray:
    """`draws_to_json`'s columns back as [S, p] in `names` order, NaN for None."""
    return np.column_stack(
        [np.array([np.nan if v is None else v for v in doc[n]], dtype=np.float64) for n in names]
    )


SURFACE_DRAW_NAMES = ("E", "A", "alpha", "B", "beta")
LAW_DRAW_NAMES = ("E", "K", "alpha")


@dataclasses.dataclass(frozen=True)
class LackOfFit:
    """A chi-square lack-of-fit test of a law against its points' noise (methods.md 4.11)."""

    statistic: float
    dof: int
    p_value: float

    def to_json(self) -> dict:
        return {"chi2": self.statistic, "dof": self.dof, "p": self.p_value}

    @classmethod
    def from_json(cls, doc: dict | None) -> LackOfFit | None:
        return cls(doc["chi2"], doc["dof"], doc["p"]) if doc else None


@dataclasses.dataclass(frozen=True)
class SurfaceRecord:
    """An arm's surface L = E + A N^-alpha + B D^-beta: parameters, intervals, verdict, its
    lack-of-fit test, and its draws [S, 5] (E, A, alpha, B, beta) with the N and D it was
    fitted over, so that `k3scale predict` reads it at an unseen N and D."""

    params: dict[str, float | None]
    intervals: dict[str, list[float] | None]
    verdict: Verdict
    n_points: int
    form: str
    lack_of_fit: LackOfFit | None = None
    # Draws are data, not identity: two records are equal by their fit (arrays have no ==).
    draws: np.ndarray | None = dataclasses.field(default=None, compare=False)
    n_range: tuple[float, float] | None = None
    d_range: tuple[float, float] | None = None

    def to_json(self) -> dict:
        out = {
            "form": self.form,
            "params": self.params,
            "ci": self.intervals,
            "n_points": self.n_points,
            "verdict": self.verdict.to_json(),
        }
        if self.lack_of_fit is not None:
            out["lack_of_fit"] = self.lack_of_fit.to_json()
        if self.draws is not None:
            out["n_range"], out["d_range"] = list(self.n_range), list(self.d_range)
            out["draws"] = draws_to_json(self.draws, SURFACE_DRAW_NAMES)
        return out

    @classmethod
    def from_json(cls, doc: dict) -> SurfaceRecord:
        return cls(
            params=doc["params"],
            intervals=doc["ci"],
            verdict=Verdict.from_json(doc["verdict"]),
            n_points=doc["n_points"],
            form=doc["form"],
            lack_of_fit=LackOfFit.from_json(doc.get("lack_of_fit")),
            draws=draws_from_json(doc["draws"], SURFACE_DRAW_NAMES) if "draws" in doc else None,
            n_range=tuple(doc["n_range"]) if "n_range" in doc else None,
            d_range=tuple(doc["d_range"]) if "d_range" in doc else None,
        )


@dataclasses.dataclass(frozen=True)
class LawRecord:
    """An arm's frontier law L*(C) = E + K (C / C_ref)^-alpha through its Pareto points: the
    point fit, its checks, and its draws [S, 3] (E, K, alpha), so that the law predicts at
    computes it never saw (`k3scale predict`).

    Attributes:
        pinned_e: the asymptote the law was held to (None: E was fitted).
        log_c_ref: log of C_ref, the geometric mean of the Pareto computes.
        compute_range: the computes of the arm's cells (the law's support).
        points: Pareto points it was fitted through.
    """

    form: str
    pinned_e: float | None
    params: dict[str, float]
    log_c_ref: float
    compute_range: tuple[float, float]
    verdict: Verdict
    points: int
    lack_of_fit: LackOfFit | None
    draws: np.ndarray = dataclasses.field(compare=False)

    def to_json(self) -> dict:
        return {
            "form": self.form,
            "pinned_e": self.pinned_e,
            "params": self.params,
            "log_c_ref": self.log_c_ref,
            "compute_range": list(self.compute_range),
            "verdict": self.verdict.to_json(),
            "points": self.points,
            "lack_of_fit": None if self.lack_of_fit is None else self.lack_of_fit.to_json(),
            "draws": draws_to_json(self.draws, LAW_DRAW_NAMES),
        }

    @classmethod
    def from_json(cls, doc: dict) -> LawRecord:
        return cls(
            form=doc["form"],
            pinned_e=doc["pinned_e"],
            params=doc["params"],
            log_c_ref=doc["log_c_ref"],
            compute_range=tuple(doc["compute_range"]),
            verdict=Verdict.from_json(doc["verdict"]),
            points=doc["points"],
            lack_of_fit=LackOfFit.from_json(doc["lack_of_fit"]),
            draws=draws_from_json(doc["draws"], LAW_DRAW_NAMES),
        )


@dataclasses.dataclass(frozen=True)
class ArmFrontier:
    """One arm's frontier by one route: its curve, and the surface (surface route), the
    frontier law (law routes) and the number of Pareto points (every route but the surface)."""

    curve: Curve
    surface: SurfaceRecord | None = None
    pareto_points: int | None = None
    law: LawRecord | None = None

    def to_json(self) -> dict:
        out: dict = {"curve": self.curve.to_json()}
        if self.surface is not None:
            out["surface"] = self.surface.to_json()
        if self.pareto_points is not None:
            out["pareto_points"] = self.pareto_points
        if self.law is not None:
            out["law"] = self.law.to_json()
        return out

    @classmethod
    def from_json(cls, doc: dict) -> ArmFrontier:
        surface = doc.get("surface")
        return cls(
            curve=Curve.from_json(doc["curve"]),
            surface=SurfaceRecord.from_json(surface) if surface else None,
            pareto_points=doc.get("pareto_points"),
            law=LawRecord.from_json(doc["law"]) if "law" in doc else None,
        )


@dataclasses.dataclass(frozen=True)
class Route:
    """One route's frontiers per arm, M(C) of each new arm over the baseline (one Estimate per
    compute value of the comparison) and its rate d log M / d log C with the compute values it
    was read over; or why the route was skipped."""

    arms: dict[str, ArmFrontier]
    multiplier: dict[str, list[Estimate]]
    rate: dict[str, Estimate] = dataclasses.field(default_factory=dict)
    skipped: str | None = None
    rate_at: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        if self.skipped:
            return {"skipped": self.skipped}
        return {
            "arms": {name: arm.to_json() for name, arm in self.arms.items()},
            "multiplier": {new: [e.to_json() for e in m] for new, m in self.multiplier.items()},
            "rate": {new: e.to_json() for new, e in self.rate.items()},
            "rate_at": {new: list(at) for new, at in self.rate_at.items()},
        }

    @classmethod
    def from_json(cls, doc: dict) -> Route:
        if "skipped" in doc:
            return cls({}, {}, skipped=doc["skipped"])
        return cls(
            arms={name: ArmFrontier.from_json(a) for name, a in doc["arms"].items()},
            multiplier={
                new: [Estimate.from_json(e) for e in m] for new, m in doc["multiplier"].items()
            },
            rate={new: Estimate.from_json(e) for new, e in doc["rate"].items()},
            rate_at={new: tuple(at) for new, at in doc.get("rate_at", {}).items()},
        )


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Both routes between arms under one FLOP convention: M(C) of every other arm over
    `baseline` at each value of `compute`; or why there is none."""

    baseline: str
    compute: tuple[float, ...] = ()
    routes: dict[str, Route] = dataclasses.field(default_factory=dict)
    skipped: str | None = None

    @property
    def others(self) -> list[str]:
        return sorted({new for r in self.routes.values() for new in r.multiplier})

    def to_json(self) -> dict:
        if self.skipped:
            return {"skipped": self.skipped}
        return {
            "baseline": self.baseline,
            "compute": list(self.compute),
            "routes": {name: route.to_json() for name, route in self.routes.items()},
            "agreement": {new: self.agreement(new) for new in self.others},
        }

    @classmethod
    def from_json(cls, doc: dict) -> Comparison:
        if "skipped" in doc:
            return cls(doc.get("baseline", ""), skipped=doc["skipped"])
        return cls(
            baseline=doc["baseline"],
            compute=_floats(doc["compute"]),
            routes={name: Route.from_json(r) for name, r in doc["routes"].items()},
        )

    def agreement(self, new: str) -> list[dict]:
        """Per compute value: the routes that identify M(C) there (those whose own checks pass),
        their lowest and highest M, and whether every pair of their intervals overlaps."""
        routes = {
            name: route.multiplier[new]
            for name, route in sorted(self.routes.items())
            if new in route.multiplier
        }
        out = []
        for i in range(len(self.compute)):
            passing = {name: m[i] for name, m in routes.items() if m[i].identified}
            out.append(route_agreement(passing))
        return out


def route_agreement(passing: dict[str, Estimate]) -> dict:
    """Whether the identified estimates of several routes agree: every pair of intervals
    overlaps. With one route there is nothing to agree with, and it says so."""
    if not passing:
        return {"routes": [], "status": "no route identifies it"}
    values = [e.value for e in passing.values()]
    doc = {"routes": sorted(passing), "low": min(values), "high": max(values)}
    if len(passing) == 1:
        return {**doc, "status": "one route identifies it"}
    intervals = [e.interval for e in passing.values()]
    overlap = all(a[0] <= b[1] and b[0] <= a[1] for a in intervals for b in intervals)
    return {**doc, "status": "agree (intervals overlap)" if overlap else "disagree"}


def read_cell_optima(results: dict) -> list[CellOptimumRecord]:
    return [CellOptimumRecord.from_json(o) for o in results.get("cell_optima", [])]


def read_comparisons(results: dict) -> dict[str, Comparison]:
    """The compute-optimal comparison of every FLOP convention, by convention."""
    return {
        conv: Comparison.from_json(doc)
        for conv, doc in sorted(results.get("compute_optimal", {}).items())
    }


def read_schedule_comparison(results: dict) -> ScheduleComparison | None:
    doc = results.get("schedule_comparison")
    return ScheduleComparison.from_json(doc) if doc else None


@dataclasses.dataclass(frozen=True)
class SkippedFit:
    """A fit `k3scale fit` did not make, and why (the data could not support it)."""

    reason: str

    def to_json(self) -> dict:
        return {"skipped": self.reason}


def read_fit(doc: dict) -> FitResult | SkippedFit:
    """An HP-law or IsoFLOP entry of `per_schedule` / `per_arch`: the fit, or why there is none."""
    return SkippedFit(doc["skipped"]) if "skipped" in doc else FitResult.from_dict(doc)


def read_isoflop(results: dict) -> dict[tuple[str, str], FitResult | SkippedFit]:
    """(arch, conv) -> `per_arch.<arch>.isoflop.<conv>`: N_opt(C) through the IsoFLOP minima."""
    return {
        (arch, conv): read_fit(doc)
        for arch, part in sorted(results.get("per_arch", {}).items())
        for conv, doc in sorted(part.get("isoflop", {}).items())
    }


def read_hp_laws(results: dict, form: str) -> dict[tuple[str, str, str], FitResult | SkippedFit]:
    """(schedule, conv, target) -> the `form` ("C" or "N,D") law of `target` (lr_opt, batch_opt)
    in `per_schedule.<schedule>.hp_laws.<conv>`, or why it was skipped (for the convention, the
    target, or this form)."""
    out = {}
    for schedule, part in sorted(results.get("per_schedule", {}).items()):
        for conv, targets in sorted(part.get("hp_laws", {}).items()):
            for target in HP_TARGETS:
                doc = targets if "skipped" in targets else targets.get(target)
                if doc is not None:
                    entry = doc if "skipped" in doc else doc.get(form)
                    if entry is not None:
                        out[(schedule, conv, target)] = read_fit(entry)
    return out
