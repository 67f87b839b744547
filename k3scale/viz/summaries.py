"""Per-cell summaries of a run table (polars): best trials with edge flags, shared runs, counts.

These are aggregations, not fits: the best finished tuned trial of each cell and what the study
spent. Fitted quantities, and every interval on them, come from `k3scale fit`.
Run-table columns are those of INTERFACES.md section 9; arms are `tuned`, `seed` and `shared`
(k3scale/sweep/sources.py).
"""

from __future__ import annotations

import polars as pl

from k3scale.errors import K3ScaleError

CELL_COLUMNS = ("cell", "arch", "schedule", "size", "budget_tokens")
REQUIRED_RUN_COLUMNS = (
    "run_id",
    "status",
    "arm",
    *CELL_COLUMNS,
    "lr",
    "batch_size",
    "batch_tokens",
    "n_active",
    "tokens",
    "c_6n",
    "c_attn",
)
TUNED, SEED, SHARED = "tuned", "seed", "shared"


def require_columns(table: pl.DataFrame, columns, what: str) -> None:
    """Raise K3ScaleError naming every missing column of `table`."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise K3ScaleError(
            f"dashboard: {what} lacks column(s) {', '.join(missing)}; "
            "re-export it with `k3scale export` (INTERFACES.md section 9)"
        )


def finished_with(runs: pl.DataFrame, metric: str) -> pl.DataFrame:
    """Finished runs whose `metric` is a finite number."""
    require_columns(runs, (*REQUIRED_RUN_COLUMNS, metric), "the run table")
    return runs.filter(
        (pl.col("status") == "finished") & pl.col(metric).is_not_null() & pl.col(metric).is_finite()
    )


def _edge(best: float, low: float, high: float) -> str | None:
    if low == high:
        return None
    if best <= low:
        return "low"
    return "high" if best >= high else None


def best_trials(runs: pl.DataFrame, metric: str) -> pl.DataFrame:
    """Best finished tuned trial per cell, with edge-of-range flags.

    A best trial is flagged `low`/`high` when its LR (or batch) equals the smallest/largest value
    tried in the cell by any tuned trial, diverged ones included: the true optimum may then lie
    outside the searched range.

    Returns:
        One row per cell: CELL_COLUMNS, `n_active`, `tokens`, `c_6n`, `c_attn`, `lr`,
        `batch_size`, `batch_tokens`, `loss` (the metric), `run_id`, `num_tuned` (tuned runs
        in the cell, any status), `lr_edge`, `batch_edge` (None, "low" or "high").
    """
    tuned = runs.filter(pl.col("arm") == TUNED)
    ranges = tuned.group_by("cell").agg(
        pl.len().alias("num_tuned"),
        pl.col("lr").min().alias("lr_low"),
        pl.col("lr").max().alias("lr_high"),
        pl.col("batch_size").min().alias("batch_low"),
        pl.col("batch_size").max().alias("batch_high"),
    )
    best = (
        finished_with(tuned, metric)
        .sort(metric, "run_id")
        .group_by("cell", maintain_order=True)
        .first()
        .join(ranges, on="cell")
    )
    rows = []
    for row in best.iter_rows(named=True):
        rows.append(
            {
                **{c: row[c] for c in CELL_COLUMNS},
                **{c: row[c] for c in ("n_active", "tokens", "c_6n", "c_attn", "run_id")},
                **{c: row[c] for c in ("lr", "batch_size", "batch_tokens", "num_tuned")},
                "loss": row[metric],
                "lr_edge": _edge(row["lr"], row["lr_low"], row["lr_high"]),
                "batch_edge": _edge(row["batch_size"], row["batch_low"], row["batch_high"]),
            }
        )
    schema_hint = {"lr_edge": pl.String, "batch_edge": pl.String}
    return pl.DataFrame(rows, schema_overrides=schema_hint, infer_schema_length=None).sort(
        "arch", "schedule", "n_active", "budget_tokens"
    )


def grid_shared_runs(runs: pl.DataFrame, metric: str, reference: str = "cosine") -> pl.DataFrame:
    """The shared setting of a study tuned on one LR grid, which runs no shared arm of its own:
    each other schedule's tuned run at the `reference` schedule's best (lr, batch) of the same
    (arch, size, budget). Empty where the grid has no such run (a sampled search)."""
    optima = best_trials(runs, metric).filter(pl.col("schedule") == reference)
    tuned = finished_with(runs, metric).filter(
        (pl.col("arm") == TUNED) & (pl.col("schedule") != reference)
    )
    at_best = optima.select("arch", "size", "budget_tokens", "lr", "batch_size")
    return tuned.join(at_best, on=["arch", "size", "budget_tokens", "lr", "batch_size"])


def status_counts(runs: pl.DataFrame) -> pl.DataFrame:
    """Per cell: runs by status and compute spent (FLOPs, 6 N_active D: each run's c_6n, a WSD
    branch's from its fork on, as its trunk spent the rest)."""
    require_columns(runs, REQUIRED_RUN_COLUMNS, "the run table")
    return (
        runs.group_by(CELL_COLUMNS)
        .agg(
            pl.len().alias("num_runs"),
            (pl.col("status") == "finished").sum().alias("finished"),
            (pl.col("status") == "diverged").sum().alias("diverged"),
            (pl.col("status") == "failed").sum().alias("failed"),
            _own_compute(runs).sum().alias("compute"),
            pl.col("n_active").first(),
        )
        .sort("arch", "schedule", "n_active", "budget_tokens")
    )


def _own_compute(runs: pl.DataFrame) -> pl.Expr:
    """c_6n less, for a branch, the share of its tokens before its fork (its trunk's)."""
    spent = pl.col("c_6n").fill_null(0.0)
    if not {"trunk_run_id", "fork_step", "batch_tokens"} <= set(runs.columns):
        return spent
    before_fork = pl.col("fork_step") * pl.col("batch_tokens") / pl.col("tokens")
    shared = pl.when(pl.col("trunk_run_id").is_not_null()).then(before_fork).otherwise(0.0)
    return spent * (1.0 - shared.fill_null(0.0).clip(0.0, 1.0))


def representative_cells(runs: pl.DataFrame) -> list[str]:
    """The largest (size, budget) cell of each (arch, schedule): where tuning matters most."""
    require_columns(runs, REQUIRED_RUN_COLUMNS, "the run table")
    ordered = (
        runs.select(*CELL_COLUMNS, "n_active")
        .unique()
        .sort("arch", "schedule", "n_active", "budget_tokens")
    )
    last = ordered.group_by("arch", "schedule", maintain_order=True).last()
    return last["cell"].to_list()


def cell_label(size: str, budget_tokens: int) -> str:
    """'k3-t2, D=2.6e5' for axes and legends."""
    mantissa, exponent = f"{budget_tokens:.1e}".split("e")
    return f"{size}, D={mantissa}e{int(exponent)}"


def tuned_text(runs: pl.DataFrame) -> str:
    """What the tuning trials searched: 'peak LR and batch', or 'peak LR, batch fixed at B
    sequences' where they all ran one batch size (an LR grid); a title adds its other fixed
    settings after a comma, never in a second pair of brackets."""
    tuned = runs.filter(pl.col("arm") == TUNED) if "arm" in runs.columns else runs
    # A failed attempt may carry no params (tests/viz/test_command.py).
    batches = sorted(tuned["batch_size"].drop_nulls().unique().to_list())
    if len(batches) == 1:
        return f"peak LR, batch fixed at {batches[0]} sequences"
    return "peak LR and batch"
