"""Compute-optimal frontiers L*(C) of each arm by both routes, and the compute multiplier M(C) of
one arm over the baseline (methods.md 2.1-2.6), drawn exactly as `k3scale fit` stored them.

Nothing is fitted or interpolated here (issue 32): curves, bands, cell optima, M(C) values and
their intervals are the artifact's numbers, so the figure and the report never disagree.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.scaling.headline import rate_text
from k3scale.scaling.values.fitdoc import ArmFrontier, CellOptimumRecord, Comparison
from k3scale.scaling.values.text import ratio_text, reason_text, verdict_text
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.viz import theme
from k3scale.viz.fits import DashboardFits
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import finished_with

INTERVAL_SOURCE = "95% interval over draws of the cell optima"


def finite_stretches(*arrays) -> list[list[int]]:
    """Maximal runs of consecutive indices where every array is finite."""
    ok = np.all([np.isfinite(np.asarray(a, dtype=np.float64)) for a in arrays], axis=0)
    stretches, current = [], []
    for i, good in enumerate(ok):
        if good:
            current.append(i)
        elif current:
            stretches.append(current)
            current = []
    return stretches + ([current] if current else [])


def band_traces(x, lo, hi, colour: str, group: str) -> list[go.Scatter]:
    """A filled band in `colour`, one polygon per stretch where both ends are defined (an
    undefined end would join the polygon across the gap); lines only, no stray markers."""
    traces = []
    for part in finite_stretches(lo, hi):
        if len(part) < 2:
            continue
        xs = [x[i] for i in part]
        traces.append(
            go.Scatter(
                x=xs + xs[::-1],
                y=[hi[i] for i in part] + [lo[i] for i in part][::-1],
                mode="lines",
                fill="toself",
                fillcolor=theme.band_fill(colour),
                line={"width": 0, "color": colour},
                hoverinfo="skip",
                name=f"{group} 95% band",
                showlegend=False,
                legendgroup=group,
            )
        )
    return traces


def _refusal(frontier: ArmFrontier) -> str | None:
    """Why the checks of the curve's surface or frontier law refuse it (None: not refused; the
    monotone route has no form to judge)."""
    fitted = frontier.surface or frontier.law
    return None if fitted is None or fitted.verdict.identified else fitted.verdict.reason


def _curve_traces(arm: str, route: str, frontier: ArmFrontier) -> list[go.Scatter]:
    colour = theme.arm_colour(arm)
    name = f"{arm} L*(C), {route} route"
    curve = frontier.curve
    if _refusal(frontier) is None:
        traces = band_traces(curve.compute, curve.lo, curve.hi, colour, name)
        line = {"color": colour, "width": 2.5, "dash": theme.ROUTE_DASH.get(route, "solid")}
        mode, marker = "lines", None
    else:
        # A surface or law its checks refuse: thin and dotted, no band, named as such; its
        # route's open marker on a few points tells the refused routes apart.
        traces, name = [], f"{name} (refused)"
        line = {"color": colour, "width": 1.5, "dash": theme.UNIDENTIFIED_DASH}
        symbol = theme.ROUTE_SYMBOL.get(route, "circle") + "-open"
        mode, marker = "lines+markers", {"symbol": symbol, "size": 7, "maxdisplayed": 8}
    traces.append(
        go.Scatter(
            x=list(curve.compute),
            y=list(curve.loss),
            mode=mode,
            marker=marker,
            name=name,
            legendgroup=name,
            line=line,
            hovertemplate=f"{name}<br>C %{{x:.3s}} FLOPs<br>L* %{{y:.4f}}<extra></extra>",
        )
    )
    return traces


def optimum_hover(o: CellOptimumRecord) -> str:
    return f"{o.cell['size']}, D={o.cell['budget_tokens']:,}: {verdict_text(o.loss.verdict)}"


def _optima_traces(optima: list[CellOptimumRecord], conv: str, style: dict) -> list[go.Scatter]:
    """Identified optima filled with their 95% bars; the others hollow, without bars."""
    traces = []
    for identified in (True, False):
        part = [o for o in optima if o.loss.identified == identified and conv in o.compute]
        if not part:
            continue
        ci = [o.loss.interval if identified else None for o in part]
        traces.append(
            go.Scatter(
                x=[o.compute[conv] for o in part],
                y=[o.loss.value for o in part],
                mode="markers",
                name=f"{style['name']} cell optima" + ("" if identified else ", not identified"),
                legendgroup=style["name"],
                marker={
                    "color": style["colour"],
                    "symbol": style["symbol"] + ("" if identified else "-open"),
                    "size": 11,
                    "line": {"color": style["colour"], "width": 2},
                },
                error_y={
                    "type": "data",
                    "array": [c[1] - o.loss.value if c else None for o, c in zip(part, ci)],
                    "arrayminus": [o.loss.value - c[0] if c else None for o, c in zip(part, ci)],
                    "visible": identified,
                },
                text=[optimum_hover(o) for o in part],
                hovertemplate="%{text}<br>C %{x:.3s} FLOPs<br>L %{y:.4f}<extra></extra>",
            )
        )
    return traces


def frontier_panel(
    runs: pl.DataFrame,
    fits: DashboardFits,
    metric: str = "final_val_ood_loss",
    compute: str = "c_6n",
) -> Panel:
    """Every finished run (faint), each cell's fitted optimum and each arm's stored L*(C).

    Log-log axes. Curves and their bands are the artifact's, over the compute range it stored.
    """
    points = finished_with(runs, metric)
    if points.is_empty() and not fits.cell_optima:
        raise K3ScaleError("dashboard: no finished runs and no cell optima for the frontier")
    groups = sorted(
        set(points.select("arch", "schedule").unique().rows())
        | {(o.cell["arch"], o.cell["schedule"]) for o in fits.cell_optima}
    )
    multi_arch = len({arch for arch, _ in groups}) > 1
    fig = go.Figure()
    for arch, schedule in groups:
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
        fig.add_traces(_optima_traces(fits.optima(arch=arch, schedule=schedule), compute, style))
    comparison = fits.comparisons.get(compute)
    for route, arm, frontier in _frontiers(comparison):
        fig.add_traces(_curve_traces(arm, route, frontier))
    fig.update_xaxes(type="log", title_text=theme.compute_title(compute))
    fig.update_yaxes(type="log", title_text=theme.loss_title(metric))
    theme.base_layout(fig, f"Compute-optimal frontier L*(C) ({compute})", height=480)
    banded = any(t.fill == "toself" for t in fig.data)
    return Panel(
        key=f"frontier-{compute}",
        figure=fig,
        caption=_frontier_caption(fits, comparison, compute, banded, metric),
    )


def _frontiers(comparison: Comparison | None) -> list[tuple[str, str, ArmFrontier]]:
    """(route, arm, frontier) of every route `k3scale fit` computed."""
    if comparison is None:
        return []
    return [
        (name, arm, frontier)
        for name, route in sorted(comparison.routes.items())
        for arm, frontier in sorted(route.arms.items())
    ]


def _skipped_routes(comparison: Comparison) -> list[tuple[str, str]]:
    return [(name, r.skipped) for name, r in sorted(comparison.routes.items()) if r.skipped]


def _frontier_caption(
    fits: DashboardFits, comparison: Comparison | None, compute: str, banded: bool, metric: str
) -> str:
    head = "Loss vs compute of every finished run (faint)"
    if not fits.cell_optima:
        return f"{head}; no fit file, so no fitted cell optimum or frontier (run `k3scale fit`)."
    if fits.loss and fits.loss != metric:
        head += f" ({metric}; every fitted quantity is of {fits.loss}, the loss it was fitted on)"
    optima = [o for o in fits.cell_optima if compute in o.compute]
    found = sum(o.loss.identified for o in optima)
    bars = (
        ", bars: 95% interval" if any(o.loss.identified and o.loss.interval for o in optima) else ""
    )
    parts = [
        f"{head}, each cell's fitted optimum from `k3scale fit` ({found} of {len(optima)} "
        f"identified; hollow: not identified{bars})"
    ]
    if comparison is None:
        parts.append("the fit file has no compute-optimal frontier")
    elif comparison.skipped:
        parts.append(f"no compute-optimal frontier: {comparison.skipped}")
    else:
        frontiers = _frontiers(comparison)
        styles = ", ".join(
            f"{r} route {theme.DASH_WORDS[theme.ROUTE_DASH.get(r, 'solid')]}"
            for r in sorted({route for route, _, _ in frontiers})
        )
        band = f" (band: {INTERVAL_SOURCE})" if banded else ""
        parts.append(f"each arm's compute-optimal frontier L*(C) as stored: {styles}{band}")
        refused = [
            f"{arm} {route} route dotted, refused: {_refusal(f)}"
            for route, arm, f in frontiers
            if _refusal(f) is not None
        ]
        if refused:
            parts.append("a refused route is drawn dotted, with its route's open marker, no band")
        parts += refused
        parts += [f"{route} route skipped: {why}" for route, why in _skipped_routes(comparison)]
    return "; ".join(parts) + "."


def _drawn(e: Estimate) -> bool:
    """A value with its interval: identified, with an interval to draw."""
    return e.identified and e.value is not None and bool(e.interval)


def _route_traces(name: str, compute: tuple[float, ...], m: list[Estimate]) -> list[go.Scatter]:
    """Identified M(C) as a line with 95% bars; not-identified values hollow, without bars."""
    colour = theme.ROUTE_COLOURS.get(name, theme.FALLBACK_COLOUR)
    good = [_drawn(e) for e in m]
    text = [f"C = {c:.3g} FLOPs: M = {ratio_text(e)}" for c, e in zip(compute, m)]
    traces = [
        go.Scatter(
            x=list(compute),
            y=[e.value if ok else None for e, ok in zip(m, good)],
            mode="lines+markers",
            name=f"{name} route",
            legendgroup=name,
            # A route identified nowhere draws no line: no legend entry for one.
            showlegend=any(good),
            line={"color": colour, "width": 3, "dash": theme.ROUTE_DASH.get(name)},
            marker={"size": 8, "symbol": theme.ROUTE_SYMBOL.get(name, "circle")},
            error_y={
                "type": "data",
                "array": [e.interval[1] - e.value if ok else None for e, ok in zip(m, good)],
                "arrayminus": [e.value - e.interval[0] if ok else None for e, ok in zip(m, good)],
                "visible": True,
            },
            text=text,
            hovertemplate="%{text}<extra></extra>",
        )
    ]
    shown = [i for i, e in enumerate(m) if not good[i] and e.value is not None]
    if shown:
        symbol = theme.ROUTE_SYMBOL.get(name, "circle") + "-open"
        traces.append(
            go.Scatter(
                x=[compute[i] for i in shown],
                y=[m[i].value for i in shown],
                mode="markers",
                name=f"{name} route, not identified (hover: why)",
                legendgroup=name,
                marker={"size": 10, "symbol": symbol, "color": colour},
                text=[text[i] for i in shown],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    return traces


def _multiplier_routes(comparison: Comparison, new: str) -> dict[str, list[Estimate]]:
    """Route -> M(C) of `new` over the baseline at each compute value, for the routes computed."""
    return {
        name: route.multiplier[new]
        for name, route in sorted(comparison.routes.items())
        if new in route.multiplier
    }


def multiplier_panel(fits: DashboardFits, conv: str, new: str) -> Panel:
    """M(C) of `new` over the baseline of `conv`'s comparison by each route, at the compute
    values the fit reports, exactly as stored."""
    comparison = fits.comparisons[conv]
    base, routes = comparison.baseline, _multiplier_routes(comparison, new)
    estimates = [e for m in routes.values() for e in m]
    drawn = [e for e in estimates if e.value is not None]
    if not drawn:
        reasons = sorted(
            {e.verdict.reason for e in estimates if e.verdict.reason}
            | {why for _, why in _skipped_routes(comparison)}
        )
        # The page lists this line where the figure would be: no axis for a number not known.
        raise K3ScaleError(
            f"dashboard: compute multiplier M(C) of {new} over {base} ({conv}) not "
            f"drawn: {'; '.join(reasons) or 'no route computed'}"
        )
    fig = go.Figure()
    for name, m in routes.items():
        fig.add_traces(_route_traces(name, comparison.compute, m))
    fig.add_hline(y=1.0, line={"color": "#999999", "width": 1})
    values = [e.value for e in drawn] + [1.0]
    values += [v for e in drawn if _drawn(e) for v in e.interval]
    fig.update_xaxes(
        type="log",
        title_text=theme.compute_title(conv),
        # Every compute value the fit reports, undefined ones too: a gap says where M is not.
        range=theme.log_range(comparison.compute, pad=0.1),
    )
    fig.update_yaxes(
        type="log",
        title_text=f"compute multiplier M of {new} over {base} (×, ratio)",
        range=theme.log_range(values),
    )
    theme.base_layout(fig, f"Compute multiplier of {new} over {base} ({conv})")
    return Panel(
        key=f"multiplier-{new}-over-{base}-{conv}",
        figure=fig,
        caption=_multiplier_caption(comparison, routes, conv, new),
        note=theme.MULTIPLIER_NOTE.format(ref=base, other=new),
    )


def _multiplier_caption(
    comparison: Comparison, routes: dict[str, list[Estimate]], conv: str, new: str
) -> str:
    num, compute = len(comparison.compute), comparison.compute
    parts = []
    for name, m in routes.items():
        good = [i for i, e in enumerate(m) if e.identified]
        if good:
            top = good[-1]
            parts.append(
                f"{name} route M = {ratio_text(m[top])} at C = {theme.fmt_sci(compute[top])} "
                f"FLOPs (the largest of {len(good)} of {num} compute values where identified)"
            )
        else:
            parts.append(f"{name} route: identified at none of {num} compute values")
    parts += [
        rate_text(comparison.routes[name].rate[new], new, comparison.baseline, f"{name} route")
        for name in routes
        if new in comparison.routes[name].rate
    ]
    parts += [f"{route} route skipped: {why}" for route, why in _skipped_routes(comparison)]
    missing: dict[tuple[str, str], list[float]] = {}
    for name, m in routes.items():
        for c, e in zip(compute, m):
            if not e.identified:
                missing.setdefault((name, reason_text(e.verdict)), []).append(c)
    parts += [
        f"{route} route at C = {', '.join(theme.fmt_sci(c) for c in cs)}: {why}"
        for (route, why), cs in missing.items()
    ]
    bars = (
        f"bars: {INTERVAL_SOURCE}; " if any(_drawn(e) for m in routes.values() for e in m) else ""
    )
    base = comparison.baseline
    return (
        f"Compute {base} needs to match {new}'s loss, as a multiple of {new}'s "
        f"({conv}), as `k3scale fit` reports it ({bars}hollow or absent: not identified): "
        f"{'; '.join(parts)}."
    )
