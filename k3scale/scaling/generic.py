"""Generic fits on any CSV table (`k3scale fit surface|frontier CSV ...`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.scaling.laws.frontier_compare import compare_frontiers
from k3scale.scaling.laws.objective import FitOptions
from k3scale.scaling.laws.surface import coarse_start_grid, fit_surface
from k3scale.scaling.values import checks


def read_columns(path: str, columns: list[str]) -> pl.DataFrame:
    """Read a CSV and check the named columns exist.

    Raises:
        K3ScaleError: the file is missing, empty or not CSV text, or a column is absent (the
            message lists what exists).
    """
    if not Path(path).is_file():
        raise K3ScaleError(f"fit: {path} not found")
    try:
        table = pl.read_csv(path, infer_schema_length=None)
    except pl.exceptions.NoDataError:
        raise K3ScaleError(f"fit: {path} is empty") from None
    except (pl.exceptions.PolarsError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise K3ScaleError(f"fit: {path} is not a readable CSV table ({reason})") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise K3ScaleError(f"fit: {path} has no column(s) {missing}; columns: {table.columns}")
    return table


def _floats(table: pl.DataFrame, column: str) -> np.ndarray:
    try:
        return table[column].cast(pl.Float64, strict=True).to_numpy()
    except pl.exceptions.InvalidOperationError:
        raise K3ScaleError(f"fit: column {column!r} is not numeric") from None


def collapse_duplicates(points: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Identical rows kept once, with the count dropped.

    A point written twice is one measurement; counted twice it would narrow the bootstrap.
    """
    unique = points.unique(maintain_order=True)
    return unique, points.height - unique.height


def _check_surface_design(points: pl.DataFrame) -> None:
    """Refuse points that cannot identify the surface (`checks.surface_design_reason`)."""
    reason = checks.surface_design_reason(points["N"].to_numpy(), points["D"].to_numpy())
    if reason:
        raise K3ScaleError(
            f"fit: the Chinchilla surface cannot be identified: got {reason} in "
            f"{points.height} rows"
        )


def parse_compute_list(text: str) -> list[float]:
    """ "1e18,2e18" -> [1e18, 2e18]; K3ScaleError on anything else."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise K3ScaleError(f"fit: --at must be comma-separated numbers, got {text!r}") from None
    if not values or any(not np.isfinite(v) or v <= 0 for v in values):
        raise K3ScaleError(f"fit: --at values must be positive, got {text!r}")
    return values


def surface_from_csv(
    path: str,
    *,
    n_col: str,
    d_col: str,
    loss_col: str,
    exclude_col: str | None,
    num_resamples: int,
    seed: int,
    workers: int,
    grid: str = "epoch",
) -> dict:
    """Chinchilla surface of a CSV; flat dict with E, A, B, alpha, beta, ci, n_points, ...

    Identical (N, D, loss) rows are fitted once (`duplicates` counts the rest); too few distinct
    points for the five parameters is an error, not a fit with zero-width intervals.
    """
    cols = [n_col, d_col, loss_col, *([exclude_col] if exclude_col else [])]
    table = read_columns(path, cols)
    excluded = 0
    if exclude_col:
        flag = _floats(table, exclude_col)
        excluded = int(np.sum(flag != 0))
        table = table.filter(pl.Series(flag == 0))
    points = pl.DataFrame(
        {
            "N": checks.positive_finite("N", _floats(table, n_col)),
            "D": checks.positive_finite("D", _floats(table, d_col)),
            "L": checks.positive_finite("loss", _floats(table, loss_col)),
        }
    )
    _check_surface_design(points)
    points, duplicates = collapse_duplicates(points)
    fit = fit_surface(
        points["N"].to_numpy(),
        points["D"].to_numpy(),
        points["L"].to_numpy(),
        starts=coarse_start_grid() if grid == "coarse" else None,
        options=FitOptions(num_resamples=num_resamples, seed=seed, workers=workers),
        target=f"{loss_col}({n_col}, {d_col})",
    )
    return {
        **fit.params,
        **fit.derived,
        "ci": fit.intervals,
        "n_points": fit.n_points,
        "excluded": excluded,
        "duplicates": duplicates,
        "success": fit.success,
        "message": fit.message,
        "objective_value": fit.extra.get("objective_value"),
        "num_starts": fit.extra.get("num_starts"),
        "bootstrap": fit.extra.get("bootstrap"),
    }


def frontier_from_csv(
    path: str,
    *,
    compute_col: str,
    loss_col: str,
    group_col: str,
    baseline: str,
    at: list[float] | None,
    num_resamples: int,
    seed: int,
    workers: int,
) -> dict:
    """Per-group frontiers, multipliers vs `baseline` and the shared-exponent test of a CSV.

    Identical (compute, loss, group) rows are fitted once (`duplicates` counts the rest).
    """
    table = read_columns(path, [compute_col, loss_col, group_col])
    points, duplicates = collapse_duplicates(
        pl.DataFrame(
            {
                "C": _floats(table, compute_col),
                "L": _floats(table, loss_col),
                "group": table[group_col].cast(pl.String),
            }
        )
    )
    out = compare_frontiers(
        points["C"].to_numpy(),
        points["L"].to_numpy(),
        points["group"].to_list(),
        baseline,
        at=at,
        num_resamples=num_resamples,
        seed=seed,
        workers=workers,
    )
    return {**out, "duplicates": duplicates}
