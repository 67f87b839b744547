"""Training and validation (ID, OOD) loss curves of one cell, coloured by trial, best highlighted."""

from __future__ import annotations

import plotly.colors
import polars as pl
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import cell_label, cell_optima, require_columns

CURVE_METRICS = ("train/loss", "val/id_loss", "val/ood_loss")
BEST_COLOUR = "#000000"


def _trial_name(row: dict) -> str:
    tag = (row.get("trial") or row["run_id"]).split("#")[-1]
    return f"{tag} {row['arm']} lr={row['lr']:.2g} b={row['batch_size']}"


def _run_traces(row: dict, run_curves: pl.DataFrame, colour: str, best: bool) -> list[dict]:
    """One trace per metric as plain dicts: plotly validates them once, in `add_traces`."""
    name = _trial_name(row) + (" (best)" if best else "")
    traces = []
    for col, metric in enumerate(CURVE_METRICS, start=1):
        part = run_curves.filter(pl.col("metric") == metric).sort("tokens")
        if part.is_empty():
            continue
        traces.append(
            {
                "type": "scatter",
                "x": part["tokens"].to_list(),
                "y": part["value"].to_list(),
                "mode": "lines+markers" if metric != "train/loss" else "lines",
                "name": name,
                "legendgroup": row["run_id"],
                "showlegend": col == 1,
                "line": {
                    "color": BEST_COLOUR if best else colour,
                    "width": 3.5 if best else 1.2,
                    "dash": "solid" if row["status"] == "finished" else "dot",
                },
                "marker": {"size": 5},
                "opacity": 1.0 if best else 0.65,
                "xaxis": f"x{'' if col == 1 else col}",
                "yaxis": f"y{'' if col == 1 else col}",
                "hovertemplate": f"{name}<br>%{{x:.3s}} tokens<br>loss %{{y:.4f}}<extra></extra>",
            }
        )
    return traces


def training_curves_panel(
    runs: pl.DataFrame, curves: pl.DataFrame, cell: str, metric: str = "final_val_ood_loss"
) -> Panel:
    """Train, val-ID and val-OOD loss vs tokens of every run of `cell`; the best tuned trial bold.

    Args:
        runs: run table (INTERFACES.md section 9).
        curves: curve table (`run_id, step, tokens, metric, value`).
        cell: cell key, e.g. "k3-t2|D262144|cosine".
        metric: run-table column that ranks trials (the study objective).
    """
    require_columns(curves, ("run_id", "tokens", "metric", "value"), "the curve table")
    cell_runs = runs.filter(pl.col("cell") == cell).sort("run_id")
    if cell_runs.is_empty():
        raise K3ScaleError(f"dashboard: cell {cell!r} has no runs in the run table")
    optimum = cell_optima(cell_runs, metric)
    best_id = optimum["run_id"][0] if optimum.height else None
    cell_curves = curves.filter(pl.col("run_id").is_in(cell_runs["run_id"].implode()))
    by_run = {key[0]: part for key, part in cell_curves.group_by("run_id")}
    palette = plotly.colors.qualitative.Plotly
    titles = [theme.loss_title(m) for m in CURVE_METRICS]
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.07)
    traces = []
    ordered = sorted(cell_runs.iter_rows(named=True), key=lambda r: r["run_id"] == best_id)
    for i, row in enumerate(ordered):
        if row["run_id"] in by_run:
            colour = palette[i % len(palette)]
            traces += _run_traces(row, by_run[row["run_id"]], colour, row["run_id"] == best_id)
    fig.add_traces(traces)
    fig.update_xaxes(type="log", title_text="tokens seen (tokens)")
    fig.update_yaxes(title_text=f"loss ({theme.LOSS_UNIT})", col=1)
    first = cell_runs.row(0, named=True)
    title = f"Loss curves, {cell_label(first['size'], first['budget_tokens'])}, {first['schedule']}"
    theme.base_layout(fig, title, height=460)
    counts = cell_runs["status"].value_counts()
    count = dict(zip(counts["status"].to_list(), counts["count"].to_list()))
    if best_id is None:
        headline = "no trial finished"
    else:
        best = optimum.row(0, named=True)
        headline = (
            f"best trial lr={best['lr']:.3g}, batch={best['batch_size']} reaches "
            f"{theme.METRIC_LABELS.get(metric, metric)} {best['loss']:.4f} {theme.LOSS_UNIT}"
        )
    caption = (
        f"Loss vs tokens for the {cell_runs.height} runs of cell {cell} "
        f"({count.get('diverged', 0)} diverged, {count.get('failed', 0)} failed; dotted); "
        f"{headline} (bold black)."
    )
    return Panel(key=f"curves-{_slug(cell)}", figure=fig, caption=caption)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text).strip("-")
