"""Study overview: runs per cell by status, and compute spent per cell."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import status_counts


def overview_panel(runs: pl.DataFrame) -> Panel:
    """Stacked bars of finished/diverged/failed runs per cell and a bar of FLOPs per cell."""
    counts = status_counts(runs)
    if counts.is_empty():
        raise K3ScaleError("dashboard: the run table is empty")
    cells = counts["cell"].to_list()
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        horizontal_spacing=0.1,
        subplot_titles=("runs per cell", "compute spent per cell"),
    )
    for status in ("finished", "diverged", "failed"):
        fig.add_trace(
            go.Bar(
                x=cells,
                y=counts[status].to_list(),
                name=status,
                marker={"color": theme.STATUS_COLOURS[status]},
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Bar(
            x=cells,
            y=counts["compute"].to_list(),
            name="compute (6·N_active·tokens)",
            marker={"color": "#555555"},
        ),
        row=1,
        col=2,
    )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(
        title_text="cell (size|D tokens|schedule)", tickangle=-60, tickfont={"size": 9}
    )
    # Counts get integer ticks: a step of at least one run, about six ticks.
    most = max(counts["num_runs"].max(), 1)
    fig.update_yaxes(
        title_text="runs (count)",
        tickformat="d",
        dtick=max(1, math.ceil(most / 6)),
        range=[0, most * 1.05],
        row=1,
        col=1,
    )
    # Linear from zero: on a log axis a bar's height is not its size (issue 51: 1.33e11 drawn
    # as a fifteenth of 1.70e11).
    fig.update_yaxes(
        title_text="training compute 6·N_active·D (FLOPs)",
        rangemode="tozero",
        row=1,
        col=2,
    )
    theme.base_layout(fig, "Study overview", height=500)
    return Panel(key="overview", figure=fig, caption=_caption(runs, counts))


def _caption(runs: pl.DataFrame, counts: pl.DataFrame) -> str:
    arms = runs.group_by("arm").len().sort("arm")
    arm_text = ", ".join(f"{a} {n}" for a, n in arms.rows())
    return (
        f"{counts.height} cells, {runs.height} runs ({arm_text}): "
        f"{counts['finished'].sum()} finished, {counts['diverged'].sum()} diverged, "
        f"{counts['failed'].sum()} failed; compute spent "
        f"{theme.fmt_sci(counts['compute'].sum())} FLOPs (6·N_active·D; a WSD branch counts "
        "from its fork, its trunk the rest)."
    )
