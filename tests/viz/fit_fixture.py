"""Fit JSON for the fixture tables, made with k3scale/scaling's own fitting functions.

This is what `k3scale fit` is expected to write for the dashboards (k3scale/viz/fits.py
documents the sections): frontier comparisons of K3 vs K2 per schedule with a dense `at` grid
(the M(C) band), per-group L(C) bands from bootstrap refits, HP power laws per (arch, schedule)
with bands, and Chinchilla surfaces. Bands are percentiles of the refitted curves at each C.
"""

from __future__ import annotations

import functools

import numpy as np
import polars as pl

from k3scale.scaling import frontier, surface
from k3scale.scaling.bootstrap import run_bootstrap
from k3scale.scaling.frontier_compare import compare_frontiers
from k3scale.scaling.powerlaw import fit_power_law
from k3scale.scaling.result import round_floats
from k3scale.viz.summaries import cell_optima

NUM_RESAMPLES = 100
GRID_POINTS = 25
# Bands and M(C) are drawn this factor beyond the data on each side (frontier.EXTRAPOLATE).
EXTEND = 4.0


def _grid(values: np.ndarray) -> np.ndarray:
    return np.geomspace(values.min() / EXTEND, values.max() * EXTEND, GRID_POINTS)


def _band(draws: np.ndarray) -> dict:
    """Percentile band [2.5, 97.5] and median over refits [B, G] -> lists of G."""
    ok = draws[np.isfinite(draws).all(axis=1)]
    lo, mid, hi = np.percentile(ok, [2.5, 50, 97.5], axis=0)
    return {"lo": lo.tolist(), "median": mid.tolist(), "hi": hi.tolist()}


def _frontier_band(c: np.ndarray, loss: np.ndarray, grid: np.ndarray, seed: int) -> dict:
    fit = frontier.fit_frontier(c, loss)
    refit = functools.partial(
        frontier.refit_frontier_vector,
        starts=np.array(fit.extra["warm_starts"]),
        log_c_ref=fit.extra["log_c_ref"],
        delta=frontier.HUBER_DELTA,
    )
    draws = run_bootstrap(
        refit, [c, loss], frontier.PARAM_NAMES, num_resamples=NUM_RESAMPLES, seed=seed
    )
    curves = np.array(
        [frontier.predict_frontier(dict(zip(frontier.PARAM_NAMES, v)), grid) for v in draws.values]
    )
    return {"x": grid.tolist(), **_band(curves)}


def _log_line(log_c: np.ndarray, log_y: np.ndarray) -> np.ndarray:
    """Least-squares [intercept, slope] of log y on log C (the power law's refit)."""
    design = np.column_stack([np.ones_like(log_c), log_c])
    return np.linalg.lstsq(design, log_y, rcond=None)[0]


def _hp_law(part: pl.DataFrame, target: str, compute: str, seed: int) -> dict:
    c, y = part[compute].to_numpy(), part[target].to_numpy().astype(float)
    fit = fit_power_law(
        {"C": c},
        y,
        num_resamples=NUM_RESAMPLES,
        seed=seed,
        target=f"{target}_opt(C)",
        units={"C": "FLOPs", target: "peak LR" if target == "lr" else "tokens/step"},
    )
    draws = run_bootstrap(
        _log_line,
        [np.log(c), np.log(y)],
        ("log_k", "exp_C"),
        num_resamples=NUM_RESAMPLES,
        seed=seed,
    )
    grid = _grid(c)
    curves = np.exp(draws.values[:, :1] + draws.values[:, 1:] * np.log(grid)[None])
    return {"fit": fit.to_dict(), "band": {"x": grid.tolist(), **_band(curves)}}


def make_fit_document(runs: pl.DataFrame, metric: str = "final_val_ood_loss") -> dict:
    """The fit JSON document of a run table with archs k2/k3 and schedules cosine/wsd."""
    optima = cell_optima(runs, metric)
    doc: dict = {"frontier_comparisons": [], "hp_power_laws": [], "surfaces": []}
    for seed, (compute, schedule) in enumerate(
        [("c_6n", "cosine"), ("c_6n", "wsd"), ("c_attn", "cosine")]
    ):
        part = optima.filter(pl.col("schedule") == schedule)
        c, loss = part[compute].to_numpy(), part["loss"].to_numpy()
        groups = part["arch"].to_numpy()
        result = compare_frontiers(
            c, loss, groups, "k2", at=_grid(c), num_resamples=NUM_RESAMPLES, seed=seed
        )
        bands = {
            arch: _frontier_band(c[groups == arch], loss[groups == arch], _grid(c), seed)
            for arch in ("k2", "k3")
        }
        doc["frontier_comparisons"].append(
            {
                "compute": compute,
                "group_key": "arch",
                "fixed": schedule,
                "result": result,
                "bands": bands,
            }
        )
    for (arch, schedule), part in optima.group_by("arch", "schedule", maintain_order=True):
        for target in ("lr", "batch_tokens"):
            law = _hp_law(part, target, "c_6n", seed=7)
            doc["hp_power_laws"].append(
                {"arch": arch, "schedule": schedule, "target": target, "compute": "c_6n", **law}
            )
        fit = surface.fit_surface(
            part["n_active"].to_numpy(),
            part["budget_tokens"].to_numpy(),
            part["loss"].to_numpy(),
            starts=surface.coarse_start_grid(),
        )
        doc["surfaces"].append({"arch": arch, "schedule": schedule, "fit": fit.to_dict()})
    return round_floats(doc)
