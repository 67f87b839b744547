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

# The colour scale tops out at the 95th percentile of the trials' gaps to their cell's best, at
# most this (nats/token): a fixed top darkened every dot of a study whose spreads are hundredths.
MAX_GAP = 0.3
MIN_GAP = 1e-3
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
    batches = sorted(group["batch_size"].unique().to_list())
    if len(batches) < 2:
        raise K3ScaleError(
            f"dashboard: no LR x batch landscape of {arch} {schedule}: one batch size "
            f"({batches[0]}) was tried, so loss against LR is the LR-sweep panel's"
        )
    sizes = optima.sort("n_active")["size"].unique(maintain_order=True).to_list()
    # Columns are each size's budgets in order (tokens-per-parameter designs give every size
    # its own budgets: keyed on absolute tokens, most panels would be empty).
    column = _budget_columns(optima)
    cols = max(column.values()) + 1
    titles = [""] * (len(sizes) * cols)
    for (size, budget), k in column.items():
        titles[sizes.index(size) * cols + k] = cell_label(size, budget)
    fig = make_subplots(
        rows=len(sizes),
        cols=cols,
        subplot_titles=titles,
        shared_xaxes="all",
        shared_yaxes="all",
        vertical_spacing=0.2 / max(len(sizes) - 1, 1) if len(sizes) > 1 else 0.1,
        horizontal_spacing=0.05,
    )
    in_legend: set[str] = set()
    for opt in optima.iter_rows(named=True):
        row = sizes.index(opt["size"]) + 1
        col = column[(opt["size"], opt["budget_tokens"])] + 1
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
    top = _colour_top(group, optima, metric)
    fig.update_xaxes(type="log", range=_log_range(group["lr"]))
    fig.update_xaxes(title_text=theme.LR_TITLE, row=len(sizes))
    fig.update_yaxes(type="log", range=_log_range(group["batch_size"]), tickvals=batches)
    fig.update_yaxes(title_text=theme.BATCH_TITLE, row=(len(sizes) + 1) // 2, col=1)
    fig.update_layout(
        coloraxis={
            "colorscale": "Viridis",
            "cmin": 0.0,
            "cmax": top,
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
        f"the cell's best (star; the colour scale tops out at {top:.3f}, the 95th percentile of "
        f"the gaps); {edges.height} of {optima.height} optima sit at the edge of the values tried "
        f"({lr_edges} in LR), median best-to-worst spread {spread:.3f} {theme.LOSS_UNIT}."
    )
    return Panel(key=f"landscape-{arch}-{schedule}", figure=fig, caption=caption)


def _budget_columns(optima: pl.DataFrame) -> dict[tuple[str, int], int]:
    """(size, budget) -> its column: the budget's rank among its size's budgets."""
    out = {}
    for (size,), part in optima.group_by("size"):
        for k, budget in enumerate(sorted(part["budget_tokens"].unique().to_list())):
            out[(size, budget)] = k
    return out


def _colour_top(group: pl.DataFrame, optima: pl.DataFrame, metric: str) -> float:
    """The top of the colour scale: the 95th percentile of finished trials' gaps to their
    cell's best, within [MIN_GAP, MAX_GAP]."""
    best = optima.select("cell", pl.col("loss").alias("best"))
    gaps = (
        group.filter((pl.col("status") == "finished") & pl.col(metric).is_not_null())
        .join(best, on="cell")
        .select((pl.col(metric) - pl.col("best")).alias("gap"))["gap"]
    )
    top = gaps.quantile(0.95) if len(gaps) else MAX_GAP
    return float(min(MAX_GAP, max(MIN_GAP, top)))


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
