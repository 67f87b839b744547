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

# Fitted curves are drawn this factor beyond the data on each side (dashed), to show where
# extrapolation starts without suggesting the fit holds far away.
EXTRAPOLATE = 4.0


def band_traces(band: Band, colour: str, group: str) -> list[go.Scatter]:
    """A filled percentile band (no legend entry) in `colour`."""
    return [
        go.Scatter(
            x=list(band.x) + list(band.x)[::-1],
            y=list(band.hi) + list(band.lo)[::-1],
            fill="toself",
            fillcolor=theme.band_fill(colour),
            line={"width": 0},
            hoverinfo="skip",
            showlegend=False,
            legendgroup=group,
        )
    ]


def _fit_traces(fit: FrontierFit, style: dict) -> list[go.Scatter]:
    lo, hi = fit.data_range
    inside = np.geomspace(lo, hi, 60)
    below = np.geomspace(lo / EXTRAPOLATE, lo, 10)
    above = np.geomspace(hi, hi * EXTRAPOLATE, 10)
    traces = band_traces(fit.band, style["colour"], style["name"]) if fit.band else []
    label = f"{style['name']} fit α={fit.params['alpha']:.3f}"
    traces.append(
        go.Scatter(
            x=inside,
            y=fit.predict(inside),
            mode="lines",
            name=label,
            legendgroup=style["name"],
            line={"color": style["colour"], "width": 2.5, "dash": style["dash"]},
        )
    )
    for part in (below, above):
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
) -> Panel:
    """All finished runs (faint), each cell's tuned optimum, and fitted L(C) with its band.

    Log-log axes; fitted curves are dotted outside the fitted compute range.
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
            fig.add_traces(_fit_traces(fit, style))
    fig.update_xaxes(type="log", title_text=theme.compute_title(compute))
    fig.update_yaxes(type="log", title_text=theme.loss_title(metric))
    theme.base_layout(fig, "Compute frontier L(C)", height=480)
    return Panel(key=f"frontier-{compute}", figure=fig, caption=_frontier_caption(fits, compute))


def _frontier_caption(fits: DashboardFits, compute: str) -> str:
    used = [f for f in fits.frontiers if f.compute == compute]
    if not used:
        return "Loss vs compute of every run and each cell's optimum; no frontier fit supplied."
    parts = []
    for fit in used:
        interval = fit.intervals.get("alpha")
        text = f"{fit.arch} {fit.schedule} α={fit.params['alpha']:.3f}"
        text += f" {theme.fmt_interval(*interval)}" if interval else ""
        text += f", E={fit.params['E']:.3g}" + ("" if fit.success else " (fit failed)")
        parts.append(text)
    return (
        "Loss vs compute, each cell's optimum and the fitted L = E + A·C^-α with its 95% "
        f"bootstrap band (dotted: extrapolation): {'; '.join(parts)}."
    )


def multiplier_panel(fit: MultiplierFit) -> Panel:
    """M(C) = C_base(L_new(C)) / C with its band; solid inside the data, dotted outside."""
    x = np.asarray(fit.band.x)
    # Without a median, the band's geometric centre (M is a ratio).
    mid = np.asarray(
        fit.band.median
        if fit.band.median is not None
        else np.sqrt(np.asarray(fit.band.lo) * np.asarray(fit.band.hi))
    )
    lo, hi = fit.data_range
    colour = theme.ARCH_COLOURS.get(fit.new, theme.SCHEDULE_COLOURS.get(fit.new, "#444444"))
    fig = go.Figure(band_traces(fit.band, colour, "M"))
    fig.add_trace(
        go.Scatter(
            x=x,
            y=mid,
            mode="lines",
            name="M(C), extrapolated",
            line={"color": colour, "dash": "dot", "width": 1.5},
        )
    )
    inside_x, inside_y = _clip_log(x, mid, lo, hi)
    fig.add_trace(
        go.Scatter(
            x=inside_x,
            y=inside_y,
            mode="lines",
            name="M(C), within data",
            line={"color": colour, "width": 3},
        )
    )
    if fit.shared_k is not None:
        fig.add_hline(
            y=fit.shared_k,
            line={"color": "black", "dash": "dash"},
            annotation_text=f"shared-exponent k = {fit.shared_k:.2f}",
        )
    fig.add_hline(y=1.0, line={"color": "#999999", "width": 1})
    for edge in (lo, hi):
        fig.add_vline(x=edge, line={"color": "#999999", "dash": "dot", "width": 1})
    fig.update_xaxes(type="log", title_text=theme.compute_title(fit.compute))
    fig.update_yaxes(
        type="log",
        title_text=f"compute multiplier M of {fit.new} over {fit.base} (×, ratio)",
        range=_y_range(x, mid, fit),
    )
    theme.base_layout(
        fig, f"Compute multiplier of {fit.new} over {fit.base} ({fit.fixed}, {fit.compute})"
    )
    return Panel(
        key=f"multiplier-{fit.new}-over-{fit.base}-{fit.fixed}-{fit.compute}",
        figure=fig,
        caption=_multiplier_caption(fit, x, mid),
    )


def _clip_log(x: np.ndarray, y: np.ndarray, lo: float, hi: float):
    """Points of (x, y) within [lo, hi] plus the curve at lo and hi (interpolated in log-log)."""
    ok = np.isfinite(y) & (y > 0)
    x, y = x[ok], y[ok]
    ends = np.exp(np.interp(np.log([lo, hi]), np.log(x), np.log(y)))
    inside = (x > lo) & (x < hi)
    return (
        np.concatenate([[lo], x[inside], [hi]]),
        np.concatenate([[ends[0]], y[inside], [ends[1]]]),
    )


def _y_range(x: np.ndarray, mid: np.ndarray, fit: MultiplierFit) -> list[float]:
    """log10 y range: the curve everywhere and the band within the data, with some margin.

    The band far outside the data can span decades and would flatten the informative part.
    """
    inside = (x >= fit.data_range[0]) & (x <= fit.data_range[1])
    values = np.concatenate(
        [mid, np.asarray(fit.band.lo)[inside], np.asarray(fit.band.hi)[inside], [1.0]]
    )
    values = values[np.isfinite(values) & (values > 0)]
    return [float(np.log10(values.min()) - 0.1), float(np.log10(values.max()) + 0.1)]


def _log_interp(at: float, x: np.ndarray, y) -> float:
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(y) & (y > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.exp(np.interp(np.log(at), np.log(x[ok]), np.log(y[ok]))))


def _multiplier_caption(fit: MultiplierFit, x: np.ndarray, mid: np.ndarray) -> str:
    at = fit.data_range[1]
    value = _log_interp(at, x, mid)
    lo, hi = _log_interp(at, x, fit.band.lo), _log_interp(at, x, fit.band.hi)
    text = (
        f"Extra compute {fit.base} needs to match {fit.new}'s loss ({fit.fixed}, {fit.compute}): "
        f"M = {value:.2f} {theme.fmt_interval(lo, hi)} at the largest data compute "
        f"C = {theme.fmt_sci(at)} FLOPs (grey dotted lines: data range; band: 95% bootstrap)"
    )
    if fit.shared_k is not None:
        verdict = {True: "accepted", False: "rejected", None: "untested"}[fit.shared_accepted]
        interval = fit.shared_k_interval
        text += f"; shared-exponent k = {fit.shared_k:.2f}"
        text += f" {theme.fmt_interval(*interval)}" if interval else ""
        text += f" ({verdict} against separate exponents)"
    return text + "."
