"""Chinchilla views of one (arch, schedule): optimum loss vs N per token budget (iso-D slices),
and the fitted surface L(N, D) = E + A/N^alpha + B/D^beta as contours (methods.md 2.4)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.fits import DashboardFits, SurfaceFit
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import cell_optima

BUDGET_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _slice_traces(optima: pl.DataFrame, surface: SurfaceFit | None) -> list[go.Scatter]:
    traces = []
    n_grid = np.geomspace(optima["n_active"].min(), optima["n_active"].max(), 60)
    for i, (budget,) in enumerate(sorted(optima.select("budget_tokens").unique().rows())):
        colour = BUDGET_COLOURS[i % len(BUDGET_COLOURS)]
        part = optima.filter(pl.col("budget_tokens") == budget).sort("n_active")
        label = f"D = {theme.fmt_sci(budget)} tokens"
        traces.append(
            go.Scatter(
                x=part["n_active"].to_list(),
                y=part["loss"].to_list(),
                mode="markers+lines" if surface is None else "markers",
                name=label,
                legendgroup=label,
                marker={"color": colour, "size": 10},
                line={"color": colour, "dash": "dot"},
            )
        )
        if surface is not None:
            traces.append(
                go.Scatter(
                    x=n_grid,
                    y=surface.predict(n_grid, budget),
                    mode="lines",
                    name=f"{label} fit",
                    legendgroup=label,
                    showlegend=False,
                    line={"color": colour},
                )
            )
    return traces


def _contour(optima: pl.DataFrame, surface: SurfaceFit) -> list:
    # The fitted surface over the (N, D) box of the cells only: no extrapolation.
    n = np.geomspace(optima["n_active"].min(), optima["n_active"].max(), 60)
    d = np.geomspace(optima["budget_tokens"].min(), optima["budget_tokens"].max(), 60)
    z = surface.predict(n[None, :], d[:, None])
    n_opt, d_opt = compute_optimal_path(surface, n, d)
    return [
        go.Contour(
            x=np.log10(n),
            y=np.log10(d),
            z=z,
            colorscale="Viridis",
            contours={"showlabels": True, "labelfont": {"size": 9, "color": "white"}},
            colorbar={"title": {"text": f"fitted L<br>({theme.LOSS_UNIT})"}, "x": 1.02},
            hovertemplate="log10 N %{x:.2f}<br>log10 D %{y:.2f}<br>L %{z:.3f}<extra></extra>",
            showlegend=False,
        ),
        go.Scatter(
            x=np.log10(optima["n_active"].to_numpy()),
            y=np.log10(optima["budget_tokens"].to_numpy()),
            mode="markers",
            name="cells",
            marker={"color": "white", "size": 9, "line": {"color": "black", "width": 1}},
            text=optima["cell"].to_list(),
            hovertemplate="%{text}<extra></extra>",
        ),
        go.Scatter(
            x=np.log10(n_opt),
            y=np.log10(d_opt),
            mode="lines",
            name="compute-optimal (N*, D*) at C = 6ND",
            line={"color": "white", "dash": "dash", "width": 2},
        ),
    ]


def compute_optimal_path(surface: SurfaceFit, n: np.ndarray, d: np.ndarray):
    """(N*, D*) minimising the fitted L at fixed C = 6 N D, for C spanning the (n, d) grid.

    N* = G (C/6)^a with a = beta/(alpha+beta), G = (alpha A / (beta B))^(1/(alpha+beta))
    (Hoffmann et al. 2022, Approach 3); points outside the grid are dropped.
    """
    p = surface.params
    total = p["alpha"] + p["beta"]
    g = (p["alpha"] * p["A"] / (p["beta"] * p["B"])) ** (1.0 / total)
    # C = 6 N D (Kaplan et al. 2020): training FLOPs per parameter per token.
    c = np.geomspace(6 * n.min() * d.min(), 6 * n.max() * d.max(), 80)
    n_opt = g * (c / 6) ** (p["beta"] / total)
    d_opt = c / (6 * n_opt)
    keep = (n_opt >= n.min()) & (n_opt <= n.max()) & (d_opt >= d.min()) & (d_opt <= d.max())
    return n_opt[keep], d_opt[keep]


def surface_panel(
    runs: pl.DataFrame,
    fits: DashboardFits,
    arch: str,
    schedule: str,
    metric: str = "final_val_ood_loss",
) -> Panel:
    """Iso-D slices of optimum loss vs N (with surface curves) and the surface contour map."""
    optima = cell_optima(
        runs.filter((pl.col("arch") == arch) & (pl.col("schedule") == schedule)), metric
    )
    sizes_per_budget = optima.group_by("budget_tokens").agg(pl.col("n_active").n_unique())
    if optima.is_empty() or sizes_per_budget["n_active"].max() < 2:
        raise K3ScaleError(
            f"dashboard: the Chinchilla view of {arch} {schedule} needs several sizes per budget"
        )
    surface = fits.surface(arch, schedule)
    cols = 1 if surface is None else 2
    fig = make_subplots(
        rows=1,
        cols=cols,
        horizontal_spacing=0.12,
        subplot_titles=("optimum loss vs N per budget", "fitted L(N, D)")[:cols],
    )
    for trace in _slice_traces(optima, surface):
        fig.add_trace(trace, row=1, col=1)
    fig.update_xaxes(type="log", title_text=theme.PARAMS_TITLE, row=1, col=1)
    fig.update_yaxes(type="log", title_text=theme.loss_title(metric), row=1, col=1)
    if surface is not None:
        for trace in _contour(optima, surface):
            fig.add_trace(trace, row=1, col=2)
        fig.update_xaxes(title_text="log10 active parameters N (parameters)", row=1, col=2)
        fig.update_yaxes(title_text="log10 tokens trained D (tokens)", row=1, col=2)
    theme.base_layout(fig, f"Chinchilla view, {arch} {schedule}", height=480)
    fig.update_layout(legend={"orientation": "h", "y": -0.22})
    return Panel(
        key=f"surface-{arch}-{schedule}",
        figure=fig,
        caption=_caption(optima, surface, arch, schedule),
    )


def _caption(optima: pl.DataFrame, surface: SurfaceFit | None, arch: str, schedule: str) -> str:
    head = (
        f"{arch} {schedule}: cell-optimum loss vs active parameters at each of "
        f"{optima['budget_tokens'].n_unique()} token budgets"
    )
    if surface is None:
        return head + "; no surface fit supplied."
    p = surface.params
    a = p["beta"] / (p["alpha"] + p["beta"])
    return (
        f"{head}, with the fitted surface: α={p['alpha']:.3f}, β={p['beta']:.3f}, "
        f"E={p['E']:.3g} {theme.LOSS_UNIT}; compute-optimal N* ∝ C^{a:.3f} (a = β/(α+β))."
    )
