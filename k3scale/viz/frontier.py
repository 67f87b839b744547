"""Compute frontier L(C) per (arch, schedule) with its fit and bootstrap band, and the compute
multiplier M(C) of one architecture over another (methods.md 2.1 and 2.6)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.fits import Band, DashboardFits, FrontierFit, MultiplierFit
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import cell_optima, finished_with


def clip_band(band: Band, lo: float, hi: float) -> Band:
    """The part of `band` with lo <= x <= hi (bands may be evaluated beyond the data)."""
    keep = [i for i, x in enumerate(band.x) if lo * (1 - 1e-9) <= x <= hi * (1 + 1e-9)]
    x, low, high = ([v[i] for i in keep] for v in (band.x, band.lo, band.hi))
    median = tuple(band.median[i] for i in keep) if band.median is not None else None
    return Band(x=tuple(x), lo=tuple(low), hi=tuple(high), median=median)


def band_traces(band: Band, colour: str, group: str, name: str = "95% band") -> list[go.Scatter]:
    """A filled percentile band in `colour`: lines only, so no stray markers at its vertices."""
    if not band.x:
        return []
    return [
        go.Scatter(
            x=list(band.x) + list(band.x)[::-1],
            y=list(band.hi) + list(band.lo)[::-1],
            mode="lines",
            fill="toself",
            fillcolor=theme.band_fill(colour),
            line={"width": 0, "color": colour},
            hoverinfo="skip",
            name=name,
            showlegend=False,
            legendgroup=group,
        )
    ]


def _fit_traces(fit: FrontierFit, style: dict, extrapolate: float) -> list[go.Scatter]:
    lo, hi = fit.data_range
    band = clip_band(fit.band, lo / extrapolate, hi * extrapolate) if fit.band else None
    traces = band_traces(band, style["colour"], style["name"]) if band else []
    inside = np.geomspace(lo, hi, 60)
    traces.append(
        go.Scatter(
            x=inside,
            y=fit.predict(inside),
            mode="lines",
            name=f"{style['name']} fit α={fit.params['alpha']:.3f}",
            legendgroup=style["name"],
            line={"color": style["colour"], "width": 2.5, "dash": style["dash"]},
        )
    )
    if extrapolate > 1.0:
        for part in (
            np.geomspace(lo / extrapolate, lo, 10),
            np.geomspace(hi, hi * extrapolate, 10),
        ):
            traces.append(
                go.Scatter(
                    x=part,
                    y=fit.predict(part),
                    mode="lines",
                    showlegend=False,
                    legendgroup=style["name"],
                    line={"color": style["colour"], "dash": "dot", "width": 1.2},
                    hoverinfo="skip",
                )
            )
    return traces


def frontier_panel(
    runs: pl.DataFrame,
    fits: DashboardFits,
    metric: str = "final_val_ood_loss",
    compute: str = "c_6n",
    extrapolate: float = 1.0,
) -> Panel:
    """All finished runs (faint), each cell's tuned optimum, and fitted L(C) with its band.

    Log-log axes. Fitted curves and bands stay inside the fitted compute range unless
    `extrapolate` > 1 asks for that factor beyond it (then drawn dotted).
    """
    points = finished_with(runs, metric)
    optima = cell_optima(runs, metric)
    if optima.is_empty():
        raise K3ScaleError("dashboard: no finished tuned runs for the frontier")
    multi_arch = optima["arch"].n_unique() > 1
    fig = go.Figure()
    for (arch, schedule), part in optima.group_by("arch", "schedule", maintain_order=True):
        style = theme.group_style(arch, schedule, multi_arch)
        every = points.filter((pl.col("arch") == arch) & (pl.col("schedule") == schedule))
        fig.add_trace(
            go.Scatter(
                x=every[compute].to_list(),
                y=every[metric].to_list(),
                mode="markers",
                name=f"{style['name']} all runs",
                legendgroup=style["name"],
                marker={"color": style["colour"], "size": 4, "opacity": 0.25},
                hoverinfo="skip",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=part[compute].to_list(),
                y=part["loss"].to_list(),
                mode="markers",
                name=f"{style['name']} cell optima",
                legendgroup=style["name"],
                marker={"color": style["colour"], "symbol": style["symbol"], "size": 11},
                text=part["cell"].to_list(),
                hovertemplate="%{text}<br>C %{x:.3s} FLOPs<br>L %{y:.4f}<extra></extra>",
            )
        )
        fit = fits.frontier(arch, schedule, compute)
        if fit is not None:
            fig.add_traces(_fit_traces(fit, style, extrapolate))
    fig.update_xaxes(type="log", title_text=theme.compute_title(compute))
    fig.update_yaxes(type="log", title_text=theme.loss_title(metric))
    theme.base_layout(fig, "Compute frontier L(C)", height=480)
    groups = set(optima.select("arch", "schedule").unique().rows())
    used = [f for f in fits.frontiers if f.compute == compute and (f.arch, f.schedule) in groups]
    return Panel(key=f"frontier-{compute}", figure=fig, caption=_frontier_caption(used))


def _frontier_caption(used: list[FrontierFit]) -> str:
    if not used:
        return "Loss vs compute of every run and each cell's optimum; no frontier fit supplied."
    parts = []
    for fit in used:
        interval = fit.intervals.get("alpha")
        text = f"{fit.arch} {fit.schedule} α={fit.params['alpha']:.3f}"
        text += f" {theme.fmt_interval(*interval)}" if interval else ""
        text += f", E={fit.params['E']:.3g}" + ("" if fit.success else " (fit failed)")
        parts.append(text)
    banded = sum(f.band is not None for f in used)
    bands = (
        "with its 95% bootstrap band"
        if banded == len(used)
        else f"({banded} of {len(used)} with a 95% bootstrap band)"
    )
    return (
        f"Loss vs compute, each cell's optimum and the fitted L = E + A·C^-α {bands}, drawn "
        f"over the fitted compute range only: {'; '.join(parts)}."
    )


def multiplier_panel(fit: MultiplierFit) -> Panel:
    """M(C) = C_base(L_new(C)) / C with its band, over the compute both arms' data cover."""
    lo, hi = fit.data_range
    band = clip_band(fit.band, lo, hi)
    if not band.x and fit.not_identified:
        # The page lists this line where the figure would be: no axis for a number not known.
        raise K3ScaleError(
            f"dashboard: compute multiplier M(C) of {fit.new} over {fit.base} ({fit.fixed}, "
            f"{fit.compute}) not drawn: {'; '.join(fit.not_identified)}"
        )
    if not band.x:
        raise K3ScaleError(
            f"dashboard: M(C) of {fit.new} over {fit.base} has no point inside the data range"
        )
    x = np.asarray(band.x)
    # Without a median, the band's geometric centre (M is a ratio).
    mid = np.asarray(
        band.median
        if band.median is not None
        else np.sqrt(np.asarray(band.lo) * np.asarray(band.hi))
    )
    colour = theme.ARCH_COLOURS.get(fit.new, theme.SCHEDULE_COLOURS.get(fit.new, "#444444"))
    fig = go.Figure(band_traces(band, colour, "M"))
    fig.add_trace(
        go.Scatter(
            x=x,
            y=mid,
            mode="lines+markers",
            name="M(C)",
            line={"color": colour, "width": 3},
            marker={"size": 6},
        )
    )
    if fit.shared_k is not None:
        fig.add_hline(
            y=fit.shared_k,
            line={"color": "black", "dash": "dash"},
            annotation_text=f"shared-exponent k = {fit.shared_k:.2f}",
        )
    fig.add_hline(y=1.0, line={"color": "#999999", "width": 1})
    fig.update_xaxes(type="log", title_text=theme.compute_title(fit.compute), range=_x_range(x))
    fig.update_yaxes(
        type="log",
        title_text=f"compute multiplier M of {fit.new} over {fit.base} (×, ratio)",
        range=_y_range(band, mid, fit),
    )
    theme.base_layout(
        fig, f"Compute multiplier of {fit.new} over {fit.base} ({fit.fixed}, {fit.compute})"
    )
    return Panel(
        key=f"multiplier-{fit.new}-over-{fit.base}-{fit.fixed}-{fit.compute}",
        figure=fig,
        caption=_multiplier_caption(fit, band, mid),
        note=theme.MULTIPLIER_NOTE.format(ref=fit.base, other=fit.new),
    )


def _x_range(x: np.ndarray) -> list[float]:
    """log10 range of the M(C) points; one point gets a quarter decade either side."""
    lo, hi = np.log10(x.min()), np.log10(x.max())
    pad = 0.05 * (hi - lo) if hi > lo else 0.25
    return [float(lo - pad), float(hi + pad)]


def _y_range(band: Band, mid: np.ndarray, fit: MultiplierFit) -> list[float]:
    """log10 y range: the curve, its band, 1 and the shared k, with 0.05 decades of margin."""
    values = [*mid, *band.lo, *band.hi, 1.0]
    values += [fit.shared_k] if fit.shared_k is not None else []
    return theme.log_range(values)


def _multiplier_caption(fit: MultiplierFit, band: Band, mid: np.ndarray) -> str:
    # Value, interval and compute all of one entry: the largest compute drawn.
    i = int(np.argmax(band.x))
    at, lo, hi = band.x[i], band.lo[i], band.hi[i]
    text = (
        f"Extra compute {fit.base} needs to match {fit.new}'s loss ({fit.fixed}, {fit.compute}): "
        f"M = {mid[i]:.3g} {theme.fmt_interval(lo, hi)} at C = {theme.fmt_sci(at)} FLOPs, the "
        f"largest of {len(band.x)} compute values where M is identified (band: 95% bootstrap)"
    )
    if fit.shared_k is not None:
        verdict = {True: "accepted", False: "rejected", None: "untested"}[fit.shared_accepted]
        interval = fit.shared_k_interval
        text += f"; shared-exponent k = {fit.shared_k:.2f}"
        text += f" {theme.fmt_interval(*interval)}" if interval else ""
        text += f" ({verdict} against separate exponents)"
    return text + "."
