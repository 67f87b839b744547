"""LR x batch landscape of every cell of one (arch, schedule): trials coloured by loss above the
cell's best, the optimum starred, optima at the edge of the searched range flagged."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import TUNED, best_trials, cell_label, require_columns

# Colour scale tops out at this loss gap (nats/token): enough to separate good from bad trials
# at the small scales k3scale runs (typical LR-sweep spreads are a few tenths of a nat).
MAX_GAP = 0.3
# Red is on no part of Viridis, so the optimum never reads as a good or bad trial; the edge
# flag is the open symbol, not a second colour.
OPTIMUM_COLOUR = "#e31a1c"


def _cell_traces(tuned: pl.DataFrame, opt: dict, metric: str) -> list[go.Scatter]:
    ok = tuned.filter((pl.col("status") == "finished") & pl.col(metric).is_not_null())
    bad = tuned.filter(pl.col("status") != "finished")
    gap = [v - opt["loss"] for v in ok[metric].to_list()]
    traces = [
        go.Scatter(
            x=ok["lr"].to_list(),
            y=ok["batch_size"].to_list(),
            mode="markers",
            name="finished trial",
            legendgroup="finished",
            # plotly.js cannot draw a numeric colour array as a legend swatch (it warns once per
            # draw); the legend entry is `_legend_proxy` instead.
            showlegend=False,
            marker={"color": gap, "coloraxis": "coloraxis", "size": 10, "line": {"width": 0.5}},
            customdata=ok[metric].to_list(),
            hovertemplate="lr %{x:.3g}<br>batch %{y}<br>loss %{customdata:.4f}<extra></extra>",
        ),
        go.Scatter(
            x=bad["lr"].to_list(),
            y=bad["batch_size"].to_list(),
            mode="markers",
            name="diverged/failed",
            legendgroup="bad",
            marker={"symbol": "x", "color": theme.STATUS_COLOURS["diverged"], "size": 9},
            text=bad["status"].to_list(),
            hovertemplate="lr %{x:.3g}<br>batch %{y}<br>%{text}<extra></extra>",
        ),
    ]
    edge = [f"lr {opt['lr_edge']}" if opt["lr_edge"] else ""]
    edge += [f"batch {opt['batch_edge']}" if opt["batch_edge"] else ""]
    edge_text = ", ".join(e for e in edge if e)
    traces.append(
        go.Scatter(
            x=[opt["lr"]],
            y=[opt["batch_size"]],
            mode="markers+text" if edge_text else "markers",
            name="optimum (open: at an edge of the values tried)",
            legendgroup="optimum",
            marker={
                "symbol": "star-open" if edge_text else "star",
                "size": 18,
                "color": OPTIMUM_COLOUR,
                "line": {"color": OPTIMUM_COLOUR if edge_text else "black", "width": 2},
            },
            text=[f"edge: {edge_text}" if edge_text else ""],
            textposition="top center",
            cliponaxis=False,
            hovertemplate=f"optimum lr %{{x:.3g}}<br>batch %{{y}}<br>{edge_text}<extra></extra>",
        )
    )
    return traces


def lr_batch_landscape_panel(
    runs: pl.DataFrame, arch: str, schedule: str, metric: str = "final_val_ood_loss"
) -> Panel:
    """One subplot per cell (rows: sizes, columns: budgets) of tuned trials in (peak LR, batch).

    Args:
        runs: run table.
        arch, schedule: which cells.
        metric: run-table column minimised by tuning.
    """
    require_columns(runs, ("arch", "schedule", "arm", metric), "the run table")
    group = runs.filter(
        (pl.col("arch") == arch) & (pl.col("schedule") == schedule) & (pl.col("arm") == TUNED)
    )
    optima = best_trials(group, metric)
    if optima.is_empty():
        raise K3ScaleError(f"dashboard: no finished tuned runs for {arch} {schedule}")
    sizes = optima.sort("n_active")["size"].unique(maintain_order=True).to_list()
    budgets = sorted(optima["budget_tokens"].unique().to_list())
    titles = [cell_label(s, b) for s in sizes for b in budgets]
    fig = make_subplots(
        rows=len(sizes),
        cols=len(budgets),
        subplot_titles=titles,
        shared_xaxes="all",
        shared_yaxes="all",
        vertical_spacing=0.2 / max(len(sizes) - 1, 1) if len(sizes) > 1 else 0.1,
        horizontal_spacing=0.05,
    )
    in_legend: set[str] = set()
    for opt in optima.iter_rows(named=True):
        row = sizes.index(opt["size"]) + 1
        col = budgets.index(opt["budget_tokens"]) + 1
        for trace in _cell_traces(group.filter(pl.col("cell") == opt["cell"]), opt, metric):
            # One legend entry per kind, from the first cell that has points of that kind.
            trace.showlegend = (
                trace.legendgroup != "finished"
                and len(trace.x) > 0
                and trace.legendgroup not in in_legend
            )
            if trace.showlegend:
                in_legend.add(trace.legendgroup)
            fig.add_trace(trace, row=row, col=col)
    fig.add_trace(_legend_proxy())
    batches = sorted(group["batch_size"].unique().to_list())
    fig.update_xaxes(type="log", range=_log_range(group["lr"]))
    fig.update_xaxes(title_text=theme.LR_TITLE, row=len(sizes))
    fig.update_yaxes(type="log", range=_log_range(group["batch_size"]), tickvals=batches)
    fig.update_yaxes(title_text=theme.BATCH_TITLE, row=(len(sizes) + 1) // 2, col=1)
    fig.update_layout(
        coloraxis={
            "colorscale": "Viridis",
            "cmin": 0.0,
            "cmax": MAX_GAP,
            "colorbar": {"title": {"text": f"loss − cell best<br>({theme.LOSS_UNIT})"}},
        },
        legend={"orientation": "h", "y": -0.12},
    )
    theme.base_layout(
        fig, f"LR × batch landscape, {arch} {schedule}", height=180 + 220 * len(sizes)
    )
    edges = optima.filter(pl.col("lr_edge").is_not_null() | pl.col("batch_edge").is_not_null())
    lr_edges = optima.filter(pl.col("lr_edge").is_not_null()).height
    spread = _median_spread(group, metric)
    caption = (
        f"Tuned trials of {arch} {schedule} per cell in (peak LR, batch), coloured by loss above "
        f"the cell's best (star); {edges.height} of {optima.height} optima sit at the edge of the "
        f"values tried ({lr_edges} in LR), median best-to-worst spread {spread:.3f} "
        f"{theme.LOSS_UNIT}."
    )
    return Panel(key=f"landscape-{arch}-{schedule}", figure=fig, caption=caption)


def _legend_proxy() -> go.Scatter:
    """Legend swatch of the finished trials (an empty trace in one colour)."""
    return go.Scatter(
        x=[None],
        y=[None],
        mode="markers",
        name="finished trial (colour: loss − cell best)",
        legendgroup="finished",
        marker={"color": "#3b528b", "size": 10},
        hoverinfo="skip",
    )


def _log_range(values: pl.Series) -> list[float]:
    """log10 axis range with 0.2 decades of margin, so star labels at the edges stay visible."""
    return [math.log10(values.min()) - 0.2, math.log10(values.max()) + 0.2]


def _median_spread(group: pl.DataFrame, metric: str) -> float:
    spreads = (
        group.filter(pl.col("status") == "finished")
        .group_by("cell")
        .agg((pl.col(metric).max() - pl.col(metric).min()).alias("spread"))
    )
    values = sorted(v for v in spreads["spread"].to_list() if v is not None)
    return values[len(values) // 2] if values else math.nan
