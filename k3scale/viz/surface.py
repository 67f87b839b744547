"""Chinchilla views of one (arch, schedule): fitted cell-optimum loss vs N per token budget
(iso-D slices), and the stored surface L(N, D) = E + A N^-alpha + B D^-beta as contours
(methods.md 2.4).

The surface is the one the report's surface route uses (`compute_optimal.c_6n.routes.surface`,
k3scale/scaling/estimates/compute_optimal.py), drawn with its verdict; it is evaluated, never refitted.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.scaling.values.fitdoc import CellOptimumRecord, SurfaceRecord
from k3scale.scaling.values.text import verdict_text
from k3scale.viz import theme
from k3scale.viz.fits import DashboardFits
from k3scale.viz.frontier import optimum_hover
from k3scale.viz.panel import Panel

BUDGET_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
SURFACE_PARAMS = ("E", "A", "alpha", "B", "beta")


def surface_loss(surface: SurfaceRecord, n, d) -> np.ndarray:
    """The stored surface E + A N^-alpha + B D^-beta evaluated at (N, D) (nats/token)."""
    p = surface.params
    n, d = np.asarray(n, np.float64), np.asarray(d, np.float64)
    return p["E"] + p["A"] * n ** -p["alpha"] + p["B"] * d ** -p["beta"]


def _budget(o: CellOptimumRecord) -> int:
    return o.cell["budget_tokens"]


def _slice_traces(
    optima: list[CellOptimumRecord], surface: SurfaceRecord | None
) -> list[go.Scatter]:
    traces = []
    n_grid = np.geomspace(min(o.n for o in optima), max(o.n for o in optima), 60)
    dash = "solid" if surface is None or surface.verdict.identified else theme.UNIDENTIFIED_DASH
    for i, budget in enumerate(sorted({_budget(o) for o in optima})):
        colour = BUDGET_COLOURS[i % len(BUDGET_COLOURS)]
        part = sorted((o for o in optima if _budget(o) == budget), key=lambda o: o.n)
        label = f"D = {theme.fmt_sci(budget)} tokens"
        traces.append(
            go.Scatter(
                x=[o.n for o in part],
                y=[o.loss.value for o in part],
                mode="markers" if surface is not None else "markers+lines",
                name=label,
                legendgroup=label,
                marker={
                    "color": colour,
                    "size": 10,
                    "symbol": ["circle" if o.loss.identified else "circle-open" for o in part],
                    "line": {"color": colour, "width": 2},
                },
                line={"color": colour, "dash": "dot"},
                text=[optimum_hover(o) for o in part],
                hovertemplate="%{text}<br>N %{x:.3s}<br>L %{y:.4f}<extra></extra>",
            )
        )
        if surface is not None:
            # The surface at the cell's tokens trained (the budget on its design grid).
            tokens = float(np.median([o.tokens for o in part]))
            traces.append(
                go.Scatter(
                    x=n_grid,
                    y=surface_loss(surface, n_grid, tokens),
                    mode="lines",
                    name=f"{label} surface",
                    legendgroup=label,
                    showlegend=False,
                    line={"color": colour, "dash": dash},
                )
            )
    return traces


def _contour(optima: list[CellOptimumRecord], surface: SurfaceRecord) -> list:
    # The stored surface over the (N, D) box of the cells only: no extrapolation.
    n = np.geomspace(min(o.n for o in optima), max(o.n for o in optima), 60)
    d = np.geomspace(min(o.tokens for o in optima), max(o.tokens for o in optima), 60)
    return [
        go.Contour(
            x=np.log10(n),
            y=np.log10(d),
            z=surface_loss(surface, n[None, :], d[:, None]),
            colorscale="Viridis",
            contours={"showlabels": True, "labelfont": {"size": 9, "color": "white"}},
            colorbar={"title": {"text": f"surface L<br>({theme.LOSS_UNIT})"}, "x": 1.02},
            hovertemplate="log10 N %{x:.2f}<br>log10 D %{y:.2f}<br>L %{z:.3f}<extra></extra>",
            showlegend=False,
        ),
        go.Scatter(
            x=np.log10([o.n for o in optima]),
            y=np.log10([o.tokens for o in optima]),
            mode="markers",
            name="cells",
            marker={"color": "white", "size": 9, "line": {"color": "black", "width": 1}},
            text=[f"{o.cell['size']}, D={_budget(o):,}" for o in optima],
            hovertemplate="%{text}<extra></extra>",
        ),
    ]


def surface_panel(fits: DashboardFits, arch: str, schedule: str) -> Panel:
    """Iso-D slices of the fitted cell optima vs N (with the surface) and its contour map.

    Raises:
        K3ScaleError: no fit file, or no budget holding two or more sizes.
    """
    optima = fits.optima(arch=arch, schedule=schedule)
    sizes = [len({o.n for o in optima if _budget(o) == b}) for b in {_budget(o) for o in optima}]
    if not fits.cell_optima:
        raise K3ScaleError(
            f"dashboard: the Chinchilla view of {arch} {schedule} draws the cell optima of "
            "`k3scale fit` (no fit file given)"
        )
    if not sizes or max(sizes) < 2:
        raise K3ScaleError(
            f"dashboard: the Chinchilla view of {arch} {schedule} needs several sizes per budget"
        )
    surface, why = fits.surface((arch, schedule))
    if surface is not None and any(surface.params.get(p) is None for p in SURFACE_PARAMS):
        surface, why = None, f"the stored surface of {arch} {schedule} has undefined parameters"
    cols = 1 if surface is None else 2
    fig = make_subplots(
        rows=1,
        cols=cols,
        horizontal_spacing=0.12,
        subplot_titles=("fitted cell-optimum loss vs N per budget", "surface L(N, D)")[:cols],
    )
    for trace in _slice_traces(optima, surface):
        fig.add_trace(trace, row=1, col=1)
    fig.update_xaxes(type="log", title_text=theme.PARAMS_TITLE, row=1, col=1)
    fig.update_yaxes(type="log", title_text=theme.loss_title(fits.loss), row=1, col=1)
    if surface is not None:
        for trace in _contour(optima, surface):
            fig.add_trace(trace, row=1, col=2)
        fig.update_xaxes(title_text="log10 active parameters N (parameters)", row=1, col=2)
        fig.update_yaxes(title_text="log10 tokens trained D (tokens)", row=1, col=2)
    title = f"Chinchilla view, {arch} {schedule}"
    title += f" (surface {verdict_text(surface.verdict)})" if surface else " (no surface)"
    theme.base_layout(fig, title, height=480)
    fig.update_layout(legend={"orientation": "h", "y": -0.22})
    return Panel(
        key=f"surface-{arch}-{schedule}",
        figure=fig,
        caption=_caption(optima, surface, why, arch, schedule),
    )


def _caption(
    optima: list[CellOptimumRecord],
    surface: SurfaceRecord | None,
    why: str,
    arch: str,
    schedule: str,
) -> str:
    found = sum(o.loss.identified for o in optima)
    head = (
        f"{arch} {schedule}: fitted cell-optimum loss of `k3scale fit` ({found} of {len(optima)} "
        f"identified; hollow: not identified) vs N at each of "
        f"{len({_budget(o) for o in optima})} token budgets"
    )
    if surface is None:
        return f"{head}; no surface drawn: {why}."
    p = surface.params
    style = "" if surface.verdict.identified else ", drawn dotted"
    exponents = ", ".join(
        f"{symbol}={p[name]:.3f}"
        + (f" {theme.fmt_interval(*ci)}" if (ci := surface.intervals.get(name)) else "")
        for name, symbol in (("alpha", "α"), ("beta", "β"))
    )
    return (
        f"{head}, with the surface of the report's surface route (c_6n) through {surface.n_points} "
        f"cell optima{style}: {verdict_text(surface.verdict)}; {exponents}, "
        f"E={p['E']:.3g} {theme.LOSS_UNIT}."
    )
