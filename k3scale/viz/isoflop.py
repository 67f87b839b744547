"""IsoFLOP view of one (arch, schedule): loss against N at fixed compute C, minima marked.

Chinchilla Approach 2 (methods.md 2.3; Hoffmann et al. 2022): cells are grouped by compute the
way `k3scale fit` groups them (C to 2 significant digits, k3scale/scaling/study.py `isoflop`);
a level with three or more sizes gets the quadratic in log N of k3scale/scaling/isoflop.py and
its minimum (filled when inside the sizes tried, open on an edge). Levels with two sizes are
drawn without a minimum. A size x budget grid whose levels never share a compute has no
IsoFLOP view, and the page says so.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.scaling.isoflop import MIN_SIZES, isoflop_minimum
from k3scale.viz import theme
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import cell_optima

LEVEL_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def compute_levels(optima: pl.DataFrame, compute: str) -> list[tuple[float, pl.DataFrame]]:
    """(C level, its cell optima sorted by N) for levels holding two or more sizes."""
    bucketed = optima.with_columns(
        pl.col(compute).map_elements(lambda c: float(f"{c:.2g}"), pl.Float64).alias("level")
    )
    out = []
    for (level,), part in bucketed.group_by("level", maintain_order=True):
        if part["n_active"].n_unique() >= 2:
            out.append((level, part.sort("n_active")))
    return sorted(out, key=lambda kv: kv[0])


def _level_traces(level: float, part: pl.DataFrame, colour: str) -> tuple[list, dict | None]:
    n, loss = part["n_active"].to_numpy().astype(float), part["loss"].to_numpy()
    name = f"C = {theme.fmt_sci(level)} FLOPs"
    traces = [
        go.Scatter(
            x=n,
            y=loss,
            mode="markers",
            name=name,
            legendgroup=name,
            marker={"color": colour, "size": 10},
            text=part["cell"].to_list(),
            hovertemplate="%{text}<br>N %{x:.3s}<br>L %{y:.4f}<extra></extra>",
        )
    ]
    minimum = None
    if part["n_active"].n_unique() >= MIN_SIZES:
        minimum = isoflop_minimum(n, loss, "quadratic")
    if minimum is None or not np.isfinite(minimum["n_opt"]):
        traces.append(_line(n, loss, colour, name, "dot"))
        return traces, minimum
    coef = np.polyfit(np.log(n), loss, 2)
    grid = np.geomspace(n.min(), n.max(), 40)
    traces.append(_line(grid, np.polyval(coef, np.log(grid)), colour, name, "solid"))
    interior = minimum["interior"]
    traces.append(
        go.Scatter(
            x=[minimum["n_opt"]],
            y=[minimum["loss_opt"]],
            mode="markers",
            name=f"{name} minimum",
            legendgroup=name,
            showlegend=False,
            marker={
                "color": colour,
                "size": 16,
                "symbol": "star" if interior else "star-open",
                "line": {"color": "black" if interior else colour, "width": 1.5},
            },
            hovertemplate="fitted minimum<br>N_opt %{x:.3s}<br>L %{y:.4f}<extra></extra>",
        )
    )
    return traces, minimum


def _line(x, y, colour: str, group: str, dash: str) -> go.Scatter:
    return go.Scatter(
        x=x,
        y=y,
        mode="lines",
        legendgroup=group,
        showlegend=False,
        hoverinfo="skip",
        line={"color": colour, "dash": dash},
    )


def isoflop_panel(
    runs: pl.DataFrame,
    arch: str,
    schedule: str,
    metric: str = "final_val_ood_loss",
    compute: str = "c_6n",
) -> Panel:
    """Cell-optimum loss vs active parameters at each compute level with two or more sizes."""
    optima = cell_optima(
        runs.filter((pl.col("arch") == arch) & (pl.col("schedule") == schedule)), metric
    )
    levels = compute_levels(optima, compute) if optima.height else []
    if not levels:
        raise K3ScaleError(
            f"dashboard: no IsoFLOP view of {arch} {schedule}: no compute level ({compute} to 2 "
            "significant digits, as `k3scale fit` groups cells) holds two or more sizes"
        )
    fig = go.Figure()
    minima = []
    for i, (level, part) in enumerate(levels):
        traces, minimum = _level_traces(level, part, LEVEL_COLOURS[i % len(LEVEL_COLOURS)])
        fig.add_traces(traces)
        if minimum is not None:
            minima.append((level, minimum))
    points = pl.concat([p for _, p in levels])
    extra = [m["loss_opt"] for _, m in minima if np.isfinite(m["loss_opt"])]
    fig.update_xaxes(
        type="log", title_text=theme.PARAMS_TITLE, range=theme.log_range(points["n_active"])
    )
    fig.update_yaxes(
        title_text=theme.loss_title(metric), range=theme.linear_range([*points["loss"], *extra])
    )
    theme.base_layout(fig, f"IsoFLOP view, {arch} {schedule} ({compute})", height=460)
    return Panel(
        key=f"isoflop-{arch}-{schedule}-{compute}",
        figure=fig,
        caption=_caption(arch, schedule, levels, minima),
    )


def _caption(arch: str, schedule: str, levels: list, minima: list) -> str:
    found = [
        f"N_opt = {theme.fmt_sci(m['n_opt'])} at C = {theme.fmt_sci(level)}"
        + ("" if m["interior"] else " (on an edge)")
        for level, m in minima
        if np.isfinite(m["n_opt"])
    ]
    text = (
        f"{arch} {schedule}: best-trial loss of each cell vs active parameters at {len(levels)} "
        f"compute levels holding two or more sizes; {len(minima)} hold {MIN_SIZES} or more and get "
        "a quadratic in log N (Hoffmann et al. 2022), its minimum a star (open: outside the "
        "sizes tried)"
    )
    return text + (": " + "; ".join(found) if found else "; no minimum could be fitted") + "."
