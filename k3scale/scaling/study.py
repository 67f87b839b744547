"""Study-level analysis on the run table: the building blocks that `analysis/*.py` recipes use.

Each function takes the `runs` table (tables.RUN_SCHEMA) and `StudyOptions`, names every
exclusion it makes, and returns JSON-able dicts (FitResults serialised via `to_dict`).
Arms (k3scale/sweep/sources.py): "tuned" trials drive the optima; "seed" re-runs of a cell's best
point measure seed noise; "shared" runs put a schedule at the reference schedule's best point.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.scaling import compute_optimal, optimum, verdict
from k3scale.scaling.frontier import fit_frontier, predict_frontier
from k3scale.scaling.frontier_compare import compare_frontiers
from k3scale.scaling.isoflop import fit_isoflop
from k3scale.scaling.powerlaw import fit_power_law
from k3scale.scaling.schedule_compare import compare_cell, pooled
from k3scale.scaling.surface import coarse_start_grid, fit_surface, fit_surface_vpnls
from k3scale.track import schema

TUNED, SEED, SHARED = "tuned", "seed", "shared"
CELL_KEYS = ("arch", "schedule", "size", "budget_tokens")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyOptions:
    """Options every recipe records in its artifact.

    Attributes:
        loss: loss column (K3 reads held-out OOD validation loss).
        computes: FLOP conventions to report ("c_6n" = 6 N_active D, "c_attn" incl. attention).
        n_col: parameter count used as N ("n_active" per K3 Table 1, or "n_total").
        batch_col: batch column for HP optima ("batch_tokens": tokens per step).
        num_resamples: bootstrap resamples (and draws of each cell optimum) for every interval.
        seed: bootstrap seed.
        workers: processes for bootstraps and start grids.
        surface_grid: "epoch" (4,500 starts) or "coarse" (72).
        multiplier_decades: a multiplier interval wider than this is "not identified".
    """

    loss: str = "final_val_ood_loss"
    computes: tuple[str, ...] = ("c_6n", "c_attn")
    n_col: str = "n_active"
    batch_col: str = "batch_tokens"
    num_resamples: int = 1000
    seed: int = 0
    workers: int = 1
    surface_grid: str = "epoch"
    multiplier_decades: float = verdict.MULTIPLIER_DECADES

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def usable_runs(runs: pl.DataFrame, opts: StudyOptions) -> tuple[pl.DataFrame, dict]:
    """Finished runs with a finite positive loss and compute; exclusions counted by reason."""
    needed = [opts.loss, opts.n_col, opts.batch_col, "lr", "tokens", *opts.computes, *CELL_KEYS]
    missing = [c for c in needed if c not in runs.columns]
    if missing:
        raise K3ScaleError(f"analysis: run table lacks columns {missing}")
    is_finished = pl.col("status").fill_null("unknown") == schema.STATUS_FINISHED
    not_finished = runs.filter(~is_finished).with_columns(pl.col("status").fill_null("unknown"))
    finished = runs.filter(is_finished)
    bad = pl.any_horizontal(
        *(
            pl.col(c).is_null() | ~pl.col(c).cast(pl.Float64).is_finite() | (pl.col(c) <= 0)
            for c in (opts.loss, opts.n_col, opts.batch_col, "lr", "tokens", *opts.computes)
        ),
        # A run without its cell's tags (logged by hand into the experiment) belongs to no cell.
        *(pl.col(c).is_null() for c in CELL_KEYS),
    )
    kept = finished.filter(~bad)
    excluded = {
        "not_finished": not_finished.group_by("status").len().sort("status").rows(),
        "missing_or_nonpositive_values": finished.filter(bad)["run_id"].sort().to_list(),
    }
    return kept, excluded


def _cell_rows(runs: pl.DataFrame) -> list[tuple[dict, pl.DataFrame]]:
    out = []
    for key, group in runs.sort("run_id").group_by(list(CELL_KEYS), maintain_order=False):
        out.append((dict(zip(CELL_KEYS, key, strict=True)), group.sort("run_id")))
    return sorted(out, key=lambda kv: tuple(kv[0][k] for k in CELL_KEYS))


@dataclasses.dataclass(frozen=True)
class CellEstimate:
    """One cell: where it sits (N, D, compute), its optimum and the runs behind it."""

    cell: dict
    n: float
    tokens: float
    compute: dict[str, float]
    optimum: optimum.CellOptimum
    best_trial: dict
    trials: int
    seed_losses: list[float]


def _seed_group(best_loss: float, reruns: list[float]) -> list[float]:
    """Runs at one point for the noise estimate: the re-runs, or [best, re-run] for one."""
    return [best_loss, *reruns] if len(reruns) == 1 else reruns


def cell_estimates(
    runs: pl.DataFrame, opts: StudyOptions
) -> tuple[list[CellEstimate], optimum.Noise]:
    """Every cell's fitted optimum with draws, and the study's pooled run noise."""
    fitted = []
    for cell, group in _cell_rows(runs):
        tuned = group.filter(_arm(TUNED))
        if tuned.height == 0:
            continue
        lr, loss = tuned["lr"].to_numpy(), tuned[opts.loss].to_numpy()
        batch = tuned[opts.batch_col].cast(pl.Float64).to_numpy()
        quad, reason = optimum.fit_quadratic(lr, batch, loss)
        i = int(np.argmin(loss))
        best = {"lr": float(lr[i]), "batch": float(batch[i]), "loss": float(loss[i])}
        best["run_id"] = tuned["run_id"][i]
        seeds = group.filter(_arm(SEED))[opts.loss].to_list()
        fitted.append((cell, group, quad, reason, best, tuned.height, seeds))
    noise = optimum.pooled_noise(
        [f[2] for f in fitted if f[2] is not None],
        [_seed_group(f[4]["loss"], f[6]) for f in fitted if f[6]],
    )
    out = []
    for i, (cell, group, quad, reason, best, count, seeds) in enumerate(fitted):
        rng = np.random.default_rng([opts.seed, i])
        point = (best["lr"], best["batch"], best["loss"])
        est = optimum.estimate_optimum(quad, reason, point, noise, opts.num_resamples, rng)
        out.append(
            CellEstimate(
                cell=cell,
                n=float(group[opts.n_col].median()),
                tokens=float(group["tokens"].median()),
                compute={c: float(group[c].median()) for c in opts.computes},
                optimum=est,
                best_trial=best,
                trials=count,
                seed_losses=seeds,
            )
        )
    return out, noise


def cell_optima_json(estimates: list[CellEstimate], opts: StudyOptions) -> list[dict]:
    """Per cell: where it sits, its optimum with interval and verdict, the best trial."""
    out = []
    for e in estimates:
        opt = e.optimum
        ci = opt.interval()
        out.append(
            {
                "cell": e.cell,
                "n": e.n,
                "tokens": e.tokens,
                **e.compute,
                "optimum": {
                    "params": {"lr_opt": opt.lr, "batch_opt": opt.batch, "loss_opt": opt.loss},
                    "intervals": {"loss_opt": ci} if ci else {},
                    "success": opt.identified,
                    "message": "" if opt.identified else opt.verdict,
                    "mode": opt.quad.mode if opt.quad else "best trial",
                    "trials": e.trials,
                },
                "loss": opt.loss,
                "loss_ci": ci,
                "verdict": opt.verdict,
                "best_trial": e.best_trial,
                "seed_losses": e.seed_losses,
                "seed_sd": float(np.std(e.seed_losses, ddof=1)) if len(e.seed_losses) > 1 else None,
            }
        )
    return out


def _pareto(points: list[dict], compute: str) -> list[dict]:
    """Cell optima on the lower envelope in (compute, loss): no cheaper cell reaches lower."""
    out, best = [], np.inf
    for p in sorted(points, key=lambda p: (p[compute], p["loss"])):
        if p["loss"] < best:
            out.append(p)
            best = p["loss"]
    return out


def frontiers(optima: list[dict], group_key: str, baseline: str, opts: StudyOptions) -> dict:
    """L(C) = E + A C^-alpha per group through its compute-optimal (Pareto) identified optima.

    Never through every cell optimum (methods.md 2.1); the multiplier the headline reads comes
    from `compute_optimal`, this parametric fit is the curve the dashboards draw.
    """
    groups = sorted({o["cell"][group_key] for o in optima})
    if len(groups) < 2:
        return {"skipped": f"needs two {group_key} values, got {groups}"}
    out = {}
    for conv in opts.computes:
        chosen: list[tuple[str, dict]] = []
        for g in groups:
            mine = [
                o
                for o in optima
                if o["cell"][group_key] == g and verdict.is_identified(o["verdict"])
            ]
            chosen += [(g, p) for p in _pareto(mine, conv)]
        short = [g for g in groups if sum(name == g for name, _ in chosen) < 3]
        if short:
            out[conv] = {
                "skipped": f"{', '.join(short)}: fewer than 3 compute-optimal (Pareto) "
                "identified cell optima"
            }
            continue
        try:
            out[conv] = compare_frontiers(
                [p[conv] for _, p in chosen],
                [p["loss"] for _, p in chosen],
                [g for g, _ in chosen],
                baseline,
                at=_multiplier_grid([p[conv] for _, p in chosen]),
                num_resamples=opts.num_resamples,
                seed=opts.seed,
                workers=opts.workers,
                units={"C": f"FLOPs ({conv})", "L": f"{opts.loss} (nats/token)"},
            )
            out[conv]["points"] = "compute-optimal (Pareto) identified cell optima"
        except K3ScaleError as exc:
            out[conv] = {"skipped": f"{exc} (Pareto points of identified cell optima only)"}
    return out


# M(C) is reported on this many log-spaced compute values across the data (a smooth band to plot).
MULTIPLIER_POINTS = 9


def _multiplier_grid(compute: list[float]) -> list[float]:
    lo, hi = np.log(min(compute)), np.log(max(compute))
    return np.exp(np.linspace(lo, hi, MULTIPLIER_POINTS)).tolist()


def _design_cells(estimates: list[CellEstimate]):
    """`key(e)` -> (rung, budget rank) of a cell: "k3-t2" and "k2-t2" are the same rung of two
    arms' ladders, and a budget is matched by its rank among its size's budgets, so designs with
    one token budget list and designs with budgets in tokens per parameter (each size its own
    token counts, issue 20) pair the same way."""
    budgets: dict[tuple[str, str], set[int]] = {}
    for e in estimates:
        budgets.setdefault((e.cell["arch"], e.cell["size"]), set()).add(e.cell["budget_tokens"])
    ranks = {key: sorted(values) for key, values in budgets.items()}

    def key(e: CellEstimate) -> tuple[str, int]:
        size, budget = e.cell["size"], e.cell["budget_tokens"]
        return size.rsplit("-", 1)[-1], ranks[(e.cell["arch"], size)].index(budget)

    return key


def arm_optima(estimates: list[CellEstimate], group_key: str, conv: str) -> dict:
    """Identified cell optima per group as compute_optimal.ArmOptima (one FLOP convention).

    Only design cells (rung, budget rank) identified in every group enter: frontiers over different
    subsets of the design would differ by which cells happened to be identified, not by arm.
    """
    groups = sorted({e.cell[group_key] for e in estimates})
    if not groups:
        return {}
    _design_cell = _design_cells(estimates)
    common = set.intersection(
        *(
            {_design_cell(e) for e in estimates if e.cell[group_key] == g and e.optimum.identified}
            for g in groups
        )
    )
    arms = {}
    for g in groups:
        mine = [
            e
            for e in estimates
            if e.cell[group_key] == g and e.optimum.identified and _design_cell(e) in common
        ]
        if not mine or any(e.optimum.draws is None for e in mine):
            continue
        arms[g] = compute_optimal.ArmOptima(
            name=g,
            n=np.array([e.n for e in mine]),
            d=np.array([e.tokens for e in mine]),
            compute=np.array([e.compute[conv] for e in mine]),
            loss=np.array([e.optimum.loss for e in mine]),
            draws=np.column_stack([e.optimum.draws for e in mine]),
        )
    return arms


def compute_optimal_comparison(
    estimates: list[CellEstimate], group_key: str, baseline: str, opts: StudyOptions
) -> dict:
    """Both frontier routes per group and M(C) over `baseline`, once per FLOP convention."""
    out = {}
    for conv in opts.computes:
        arms = arm_optima(estimates, group_key, conv)
        if baseline not in arms or len(arms) < 2:
            out[conv] = {
                "skipped": f"needs identified cell optima of {baseline} and another {group_key} "
                f"(have {sorted(arms)})"
            }
            continue
        out[conv] = compute_optimal.compare_arms(arms, baseline, opts.multiplier_decades)
    return out


def schedule_comparison(
    estimates: list[CellEstimate], noise: optimum.Noise, reference: str, opts: StudyOptions
) -> dict:
    """Per (arch, size, budget): every schedule vs `reference`; pooled over cells."""
    by_cell: dict[tuple, dict[str, CellEstimate]] = {}
    for e in estimates:
        key = (e.cell["arch"], e.cell["size"], e.cell["budget_tokens"])
        by_cell.setdefault(key, {})[e.cell["schedule"]] = e
    cells, per_other = [], {}
    for key, schedules in sorted(by_cell.items()):
        if reference not in schedules or len(schedules) < 2:
            continue
        entry = {"cell": dict(zip(("arch", "size", "budget_tokens"), key, strict=True))}
        entry["comparison"] = {}
        for other in sorted(set(schedules) - {reference}):
            result, draws = compare_cell(
                schedules[reference].optimum, schedules[other].optimum, reference, other
            )
            entry["comparison"][other] = result
            per_other.setdefault(other, []).append((result, draws, key[:2]))
        cells.append(entry)
    return {
        "reference": reference,
        "diff": "L_reference - L_other (negative: reference lower)",
        "cells": cells,
        "pooled": {
            o: pooled([e[:2] for e in entries], [e[2] for e in entries], reference, o)
            for o, entries in per_other.items()
        },
        "run_noise": noise.to_dict(),
    }


def _arm(arm: str) -> pl.Expr:
    """Rows of one arm; runs logged without an arm tag are tuning trials."""
    if arm == TUNED:
        return pl.col("arm").is_null() | (pl.col("arm") == TUNED)
    return pl.col("arm") == arm


def identified(optima: list[dict]) -> list[dict]:
    """Cell optima whose verdict is identified (the only ones any curve is fitted through)."""
    return [o for o in optima if verdict.is_identified(o["verdict"])]


def surface(optima: list[dict], group: str | None, opts: StudyOptions) -> dict:
    """Chinchilla surface (Epoch's protocol) over the identified cell optima of one group."""
    optima = identified(optima)
    n = np.array([o["n"] for o in optima])
    d = np.array([o["tokens"] for o in optima])
    if len(np.unique(n)) < 3 or len(np.unique(d)) < 2 or len(optima) < 6:
        return {
            "skipped": f"surface needs >= 3 sizes, >= 2 budgets, >= 6 identified cells ({group})"
        }
    starts = coarse_start_grid() if opts.surface_grid == "coarse" else None
    loss = [o["loss"] for o in optima]
    try:
        fit = fit_surface(
            n,
            d,
            loss,
            starts=starts,
            num_resamples=opts.num_resamples,
            seed=opts.seed,
            workers=opts.workers,
            target=f"{opts.loss}(N, D) [{group}]",
            units={"N": f"parameters ({opts.n_col})", "D": "tokens", "L": "nats/token"},
        )
    except K3ScaleError as exc:
        # A quadratic through noisy trials can put a cell's optimum at or below zero loss.
        return {"skipped": f"{exc} (identified cell optima of {group})"}
    cross = fit_surface_vpnls(n, d, loss, target=fit.target, units=fit.units)
    reasons = [
        None if fit.success else fit.message,
        *(
            verdict.exponent_reason(p, fit.params.get(p, float("nan")), fit.intervals.get(p))
            for p in ("alpha", "beta")
        ),
    ]
    ruling = verdict.first_reason(*reasons)
    fit = fit.replace(success=verdict.is_identified(ruling), message=fit.message or ruling)
    return {**fit.to_dict(), "verdict": ruling, "vpnls_cross_check": cross.to_dict()}


def hp_laws(optima: list[dict], compute: str, opts: StudyOptions) -> dict:
    """lr_opt and batch_opt power laws from cell optima that are interior minima.

    Two forms: of compute C (DeepSeek LLM 2024) and of (N, D) jointly (StepLaw, Li et al. 2025;
    Bjorck et al. 2025), the latter only when N and D both vary over at least 4 cells.
    """
    ok = [o for o in optima if o["optimum"]["success"]]
    if len({o[compute] for o in ok}) < 3:
        return {"skipped": f"needs >= 3 cells with interior optima, got {len(ok)}"}
    regressors = {"C": {"C": np.array([o[compute] for o in ok])}}
    n, d = np.array([o["n"] for o in ok]), np.array([o["tokens"] for o in ok])
    if len(ok) >= 4 and len(np.unique(n)) >= 2 and len(np.unique(d)) >= 2:
        regressors["N,D"] = {"N": n, "D": d}
    out = {}
    for name in ("lr_opt", "batch_opt"):
        y = np.array([o["optimum"]["params"][name] for o in ok])
        if len(np.unique(y)) < 2:
            out[name] = {"skipped": f"{name} constant over cells"}
            continue
        out[name] = {}
        for form, inputs in regressors.items():
            try:
                out[name][form] = fit_power_law(
                    inputs,
                    y,
                    num_resamples=opts.num_resamples,
                    seed=opts.seed,
                    target=f"{name}({form})",
                    units={"C": f"FLOPs ({compute})", "N": opts.n_col, "D": "tokens"},
                ).to_dict()
            except K3ScaleError as exc:
                out[name][form] = {"skipped": str(exc)}
    return out


def isoflop(optima: list[dict], compute: str, opts: StudyOptions) -> dict:
    """Approach 2 where budgets (bucketed to 2 significant digits of C) hold >= 3 sizes."""
    optima = identified(optima)
    c = np.array([float(f"{o[compute]:.2g}") for o in optima])
    try:
        fit = fit_isoflop(
            c,
            np.array([o["n"] for o in optima]),
            [o["loss"] for o in optima],
            method="akima",
            num_resamples=opts.num_resamples,
            seed=opts.seed,
        )
    except K3ScaleError as exc:
        return {"skipped": str(exc)}
    return fit.to_dict()


def backtest(optima: list[dict], compute: str) -> dict:
    """Fit the frontier through the Pareto optima without the largest compute, predict it."""
    optima = _pareto(identified(optima), compute)
    c = np.array([o[compute] for o in optima])
    y = np.array([o["loss"] for o in optima])
    held = c == c.max() if len(c) else c.astype(bool)
    if len(np.unique(c[~held])) < 3:
        return {"skipped": "needs >= 3 smaller compute values among the Pareto optima"}
    try:
        fit = fit_frontier(c[~held], y[~held])
    except K3ScaleError as exc:
        # Three points are not more than the frontier's three parameters.
        return {"skipped": f"{exc} (the Pareto optima below the largest compute)"}
    if not fit.params:
        return {"skipped": f"frontier fit failed: {fit.message}"}
    pred = predict_frontier(fit.params, c[held])
    return {
        "held_out_compute": float(c.max()),
        "predicted": pred.tolist(),
        "observed": y[held].tolist(),
        "relative_error": ((pred - y[held]) / y[held]).tolist(),
        "fit": fit.to_dict(),
    }
