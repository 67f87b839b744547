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
from k3scale.scaling import measured
from k3scale.scaling.frontier import fit_frontier, predict_frontier
from k3scale.scaling.frontier_compare import compare_frontiers
from k3scale.scaling.hpopt import cell_optimum
from k3scale.scaling.isoflop import fit_isoflop
from k3scale.scaling.powerlaw import fit_power_law
from k3scale.scaling.schedule_compare import compare_cell, sign_of
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
        num_resamples: bootstrap resamples for every interval.
        seed: bootstrap seed.
        workers: processes for bootstraps and start grids.
        surface_grid: "epoch" (4,500 starts) or "coarse" (72).
    """

    loss: str = "final_val_ood_loss"
    computes: tuple[str, ...] = ("c_6n", "c_attn")
    n_col: str = "n_active"
    batch_col: str = "batch_tokens"
    num_resamples: int = 1000
    seed: int = 0
    workers: int = 1
    surface_grid: str = "epoch"

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
        )
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
    return sorted(out, key=lambda kv: tuple(str(kv[0][k]) for k in CELL_KEYS))


def cell_optima(runs: pl.DataFrame, opts: StudyOptions) -> list[dict]:
    """Per-cell tuned optimum of every (arch, schedule, size, budget) with seed noise.

    Returns:
        [{"cell": {...}, "n", "tokens", <compute cols>, "optimum": FitResult dict,
          "loss" (the optimum's loss), "seed_losses" (re-runs at the best point)}].
    """
    out = []
    for i, (cell, group) in enumerate(_cell_rows(runs)):
        tuned = group.filter(_arm(TUNED))
        if tuned.height == 0:
            continue
        fit = cell_optimum(
            tuned["lr"],
            tuned[opts.batch_col].cast(pl.Float64),
            tuned[opts.loss],
            run_ids=tuned["run_id"],
            num_resamples=opts.num_resamples,
            seed=opts.seed + i,
            target=f"{opts.loss}(lr, {opts.batch_col})",
        )
        seeds = group.filter(_arm(SEED))[opts.loss].to_list()
        out.append(
            {
                "cell": cell,
                "n": float(group[opts.n_col].median()),
                "tokens": float(group["tokens"].median()),
                **{c: float(group[c].median()) for c in opts.computes},
                "optimum": fit.to_dict(),
                "loss": fit.params["loss_opt"],
                "seed_losses": seeds,
                "seed_sd": float(np.std(seeds, ddof=1)) if len(seeds) > 1 else None,
            }
        )
    return out


# M(C) is reported on this many log-spaced compute values across the data (a smooth band to plot).
MULTIPLIER_POINTS = 9


def _multiplier_grid(compute: list[float]) -> list[float]:
    lo, hi = np.log(min(compute)), np.log(max(compute))
    return np.exp(np.linspace(lo, hi, MULTIPLIER_POINTS)).tolist()


def frontiers(optima: list[dict], group_key: str, baseline: str, opts: StudyOptions) -> dict:
    """compare_frontiers over cell optima grouped by `group_key`, once per FLOP convention."""
    groups = [o["cell"][group_key] for o in optima]
    if len(set(groups)) < 2:
        return {"skipped": f"needs two {group_key} values, got {sorted(set(groups))}"}
    out = {}
    for conv in opts.computes:
        try:
            out[conv] = compare_frontiers(
                [o[conv] for o in optima],
                [o["loss"] for o in optima],
                groups,
                baseline,
                at=_multiplier_grid([o[conv] for o in optima]),
                num_resamples=opts.num_resamples,
                seed=opts.seed,
                workers=opts.workers,
                units={"C": f"FLOPs ({conv})", "L": f"{opts.loss} (nats/token)"},
            )
        except K3ScaleError as exc:
            out[conv] = {"skipped": str(exc)}
    return out


def schedule_comparison(runs: pl.DataFrame, reference: str, opts: StudyOptions) -> dict:
    """Per (arch, size, budget): each schedule vs `reference`, with a sign summary over cells."""
    cells = []
    keys = ["arch", "size", "budget_tokens"]
    tuned = runs.filter(_arm(TUNED))
    for i, (key, group) in enumerate(sorted(tuned.group_by(keys), key=lambda kv: str(kv[0]))):
        trials = {
            s: tuple(
                g.sort("run_id")[c].cast(pl.Float64).to_numpy()
                for c in ("lr", opts.batch_col, opts.loss)
            )
            for (s,), g in group.group_by(["schedule"])
        }
        if reference not in trials or len(trials) < 2:
            continue
        result = compare_cell(
            trials, reference, num_resamples=opts.num_resamples, seed=opts.seed + i
        )
        shared = runs.filter(_arm(SHARED) & _cell_filter(dict(zip(keys, key, strict=True))))
        for other, entry in result.items():
            rows = shared.filter(pl.col("schedule") == other)
            entry["shared_arm_losses"] = rows[opts.loss].to_list()
        cells.append({"cell": dict(zip(keys, key, strict=True)), "comparison": result})
    noise = measured.run_noise_sd(_best_and_reruns(runs, opts))
    for cell in cells:
        _add_measured(cell, runs, reference, noise["sd"], opts)
    signs: dict[str, dict[str, int]] = {}
    for cell in cells:
        for other, entry in cell["comparison"].items():
            kinds = {kind: entry.get(kind, "no bootstrap") for kind in ("sign_own", "sign_shared")}
            kinds |= {
                f"measured.{k}": v["sign"] for k, v in entry["measured"].items() if "sign" in v
            }
            for kind, sign in kinds.items():
                tally = signs.setdefault(f"{other}.{kind}", {})
                tally[sign] = tally.get(sign, 0) + 1
    return {
        "reference": reference,
        "cells": cells,
        "sign_counts": signs,
        "run_noise": noise,
        "diff": "L_reference - L_other (negative: reference lower)",
    }


def _arm(arm: str) -> pl.Expr:
    """Rows of one arm; runs logged without an arm tag are tuning trials."""
    if arm == TUNED:
        return pl.col("arm").is_null() | (pl.col("arm") == TUNED)
    return pl.col("arm") == arm


def _cell_filter(cell: dict) -> pl.Expr:
    return pl.all_horizontal(*(pl.col(k) == v for k, v in cell.items()))


def _best_and_reruns(runs: pl.DataFrame, opts: StudyOptions) -> list[tuple[float, list[float]]]:
    """(best tuning trial loss, its seed re-runs' losses) of every cell that has re-runs."""
    pairs = []
    for _, group in _cell_rows(runs):
        tuned = group.filter(_arm(TUNED))
        reruns = group.filter(_arm(SEED))[opts.loss].to_list()
        if tuned.height and reruns:
            pairs.append((float(tuned[opts.loss].min()), reruns))
    return pairs


def _add_measured(
    cell: dict, runs: pl.DataFrame, reference: str, noise_sd: float | None, opts: StudyOptions
) -> None:
    """Measured-only readings (k3scale/scaling/measured.py) beside each fitted comparison."""
    rows = runs.filter(_cell_filter(cell["cell"]))

    def losses(schedule: str, arm: str) -> list[float]:
        return rows.filter((pl.col("schedule") == schedule) & _arm(arm))[opts.loss].to_list()

    for other, entry in cell["comparison"].items():
        readings = measured.cell_readings(
            (min(losses(reference, TUNED)), min(losses(other, TUNED))),
            (losses(reference, SEED), losses(other, SEED)),
            losses(other, SHARED),
            noise_sd,
        )
        for reading in readings.values():
            if "ci" in reading:
                reading["sign"] = sign_of(reading["ci"], reference, other)
        entry["measured"] = readings


def surface(optima: list[dict], group: str | None, opts: StudyOptions) -> dict:
    """Chinchilla surface over the cell optima (of one arch/schedule when `group` is given)."""
    n = np.array([o["n"] for o in optima])
    d = np.array([o["tokens"] for o in optima])
    if len(np.unique(n)) < 3 or len(np.unique(d)) < 2 or len(optima) < 6:
        return {"skipped": f"surface needs >= 3 sizes, >= 2 budgets, >= 6 cells ({group})"}
    starts = coarse_start_grid() if opts.surface_grid == "coarse" else None
    fit = fit_surface(
        n,
        d,
        [o["loss"] for o in optima],
        starts=starts,
        num_resamples=opts.num_resamples,
        seed=opts.seed,
        workers=opts.workers,
        target=f"{opts.loss}(N, D) [{group}]",
        units={"N": f"parameters ({opts.n_col})", "D": "tokens", "L": "nats/token"},
    )
    cross = fit_surface_vpnls(n, d, [o["loss"] for o in optima], target=fit.target, units=fit.units)
    return {**fit.to_dict(), "vpnls_cross_check": cross.to_dict()}


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
    """Fit the frontier without the largest compute, predict it; relative error of the loss."""
    c = np.array([o[compute] for o in optima])
    y = np.array([o["loss"] for o in optima])
    held = c == c.max()
    if len(np.unique(c[~held])) < 3:
        return {"skipped": "needs >= 3 smaller compute values"}
    fit = fit_frontier(c[~held], y[~held])
    pred = predict_frontier(fit.params, c[held])
    return {
        "held_out_compute": float(c.max()),
        "predicted": pred.tolist(),
        "observed": y[held].tolist(),
        "relative_error": ((pred - y[held]) / y[held]).tolist(),
        "fit": fit.to_dict(),
    }
