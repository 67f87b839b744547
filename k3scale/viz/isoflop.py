"""IsoFLOP view of one arch: fitted cell-optimum loss against N at fixed compute C, with the
minima `k3scale fit` found (Chinchilla Approach 2, methods.md 2.3; Hoffmann et al. 2022).

Cells are grouped into compute levels as the fit groups them (C to 2 significant digits,
k3scale/scaling/study.py `isoflop`); levels holding two or more sizes are drawn. The minima and
the N_opt(C) exponent are the artifact's (`per_arch.<arch>.isoflop.<conv>`): a filled star where
the power law used the minimum, an open one where it did not (why, on hover). Nothing is fitted
here. A size x budget grid whose levels never share a compute has no IsoFLOP view, and the page
says so.
"""

from __future__ import annotations

import plotly.graph_objects as go

from k3scale.errors import K3ScaleError
from k3scale.scaling.laws.isoflop import compute_level
from k3scale.scaling.values.fitdoc import CellOptimumRecord, SkippedFit
from k3scale.scaling.values.result import FitResult
from k3scale.scaling.values.text import verdict_text
from k3scale.viz import theme
from k3scale.viz.fits import DashboardFits
from k3scale.viz.panel import Panel

LEVEL_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def compute_levels(
    optima: list[CellOptimumRecord], conv: str
) -> list[tuple[float, list[CellOptimumRecord]]]:
    """(C level, its cell optima sorted by N) for levels holding two or more sizes."""
    levels: dict[float, list[CellOptimumRecord]] = {}
    for o in optima:
        if conv in o.compute:
            levels.setdefault(compute_level(o.compute[conv]), []).append(o)
    return [
        (level, sorted(part, key=lambda o: o.n))
        for level, part in sorted(levels.items())
        if len({o.n for o in part}) >= 2
    ]


def _level_traces(level: float, part: list[CellOptimumRecord], colour: str) -> list[go.Scatter]:
    """One line per schedule of the level (the fit pools them; a line joins one schedule's)."""
    name = f"C = {theme.fmt_sci(level)} FLOPs"
    schedules = sorted({o.cell["schedule"] for o in part})
    traces = []
    for schedule in schedules:
        mine = [o for o in part if o.cell["schedule"] == schedule]
        symbol = theme.SCHEDULE_SYMBOL.get(schedule, "square")
        traces.append(
            go.Scatter(
                x=[o.n for o in mine],
                y=[o.loss.value for o in mine],
                mode="markers+lines",
                name=name if len(schedules) == 1 else f"{name}, {schedule}",
                legendgroup=name,
                marker=theme.estimate_marker(
                    colour, symbol, [o.loss.identified for o in mine], size=10
                ),
                # Joins the cells for the eye; the minimum is the fit's, not this line's.
                line={"color": colour, "dash": "dot", "width": 1},
                text=[_hover(o) for o in mine],
                hovertemplate="%{text}<br>N %{x:.3s}<br>L %{y:.4f}<extra></extra>",
            )
        )
    return traces


def _hover(o: CellOptimumRecord) -> str:
    c = o.cell
    return f"{c['size']} {c['schedule']}, D={c['budget_tokens']:,}: {verdict_text(o.loss.verdict)}"


def found_minima(fit: FitResult) -> list[dict]:
    """The per-level minima the fit stored (`extra.minima`) that have a size and a loss."""
    return [
        m
        for m in fit.extra.get("minima", [])
        if m.get("n_opt") is not None and m.get("loss_opt") is not None
    ]


def _minima_trace(fit: FitResult, colours: dict[float, str]) -> go.Scatter | None:
    found = found_minima(fit)
    if not found:
        return None
    return go.Scatter(
        x=[m["n_opt"] for m in found],
        y=[m["loss_opt"] for m in found],
        mode="markers",
        name=f"minima of `k3scale fit` ({fit.extra.get('method', '')}; open: not used)",
        marker={
            "color": [colours.get(m["compute"], theme.FALLBACK_COLOUR) for m in found],
            "size": 16,
            "symbol": ["star" if m["used"] else "star-open" for m in found],
            "line": {"color": "black", "width": 1},
        },
        text=[
            f"C = {theme.fmt_sci(m['compute'])}: minimum over {m['num_sizes']} sizes, "
            + ("used" if m["used"] else f"not used ({m['reason']})")
            for m in found
        ],
        hovertemplate="%{text}<br>N_opt %{x:.3s}<br>L %{y:.4f}<extra></extra>",
    )


def isoflop_panel(fits: DashboardFits, arch: str, compute: str = "c_6n") -> Panel:
    """Fitted cell-optimum loss vs N at each compute level holding two or more sizes.

    Raises:
        K3ScaleError: no fit file, or no level with two or more sizes (the fit's status named).
    """
    if not fits.cell_optima:
        raise K3ScaleError(
            f"dashboard: the IsoFLOP view of {arch} draws the cell optima of `k3scale fit` (no "
            "fit file given)"
        )
    fit = fits.isoflop_fit(arch, compute)
    levels = compute_levels(fits.optima(arch=arch), compute)
    if not levels:
        raise K3ScaleError(
            f"dashboard: no IsoFLOP view of {arch}: no compute level ({compute} to 2 significant "
            f"digits, as `k3scale fit` groups cells) holds two or more sizes; "
            f"{_status(fit, fits, arch, compute)}"
        )
    colours = {level: LEVEL_COLOURS[i % len(LEVEL_COLOURS)] for i, (level, _) in enumerate(levels)}
    fig = go.Figure(
        [t for level, part in levels for t in _level_traces(level, part, colours[level])]
    )
    minima = _minima_trace(fit, colours) if isinstance(fit, FitResult) else None
    if minima is not None:
        fig.add_trace(minima)
    n = [o.n for _, part in levels for o in part] + list(minima.x if minima else [])
    loss = [o.loss.value for _, part in levels for o in part] + list(minima.y if minima else [])
    fig.update_xaxes(type="log", title_text=theme.PARAMS_TITLE, range=theme.log_range(n))
    fig.update_yaxes(title_text=theme.loss_title(fits.loss), range=theme.linear_range(loss))
    theme.base_layout(fig, f"IsoFLOP view, {arch} ({compute})", height=460)
    return Panel(
        key=f"isoflop-{arch}-{compute}",
        figure=fig,
        caption=_caption(arch, levels, _status(fit, fits, arch, compute)),
    )


def _status(
    fit: FitResult | SkippedFit | None, fits: DashboardFits, arch: str, compute: str
) -> str:
    """What the artifact says about this arch's IsoFLOP fit, in one clause."""
    if fit is None:
        return f"the fit file ({fits.analysis}) holds no IsoFLOP fit of {arch} ({compute})"
    if isinstance(fit, SkippedFit):
        return f"no IsoFLOP minima: `k3scale fit` skipped the fit: {fit.reason}"
    ci = fit.intervals.get("exp_C")
    interval = f" {theme.fmt_interval(*ci)}" if ci else ""
    found = [
        f"N_opt = {theme.fmt_sci(m['n_opt'])} at C = {theme.fmt_sci(m['compute'])}"
        + ("" if m["used"] else f" (not used: {m['reason']})")
        for m in found_minima(fit)
    ]
    return (
        f"stars: the minima of `k3scale fit` ({fit.extra.get('method', '')}), filled where "
        f"N_opt ∝ C^a used them, a = {fit.params['exp_C']:.3f}{interval}: "
        + ("; ".join(found) or "none found")
    )


def _caption(arch: str, levels: list, status: str) -> str:
    found = sum(o.loss.identified for _, part in levels for o in part)
    total = sum(len(part) for _, part in levels)
    return (
        f"{arch}: fitted cell-optimum loss of `k3scale fit` vs active parameters at {len(levels)} "
        f"compute levels holding two or more sizes ({found} of {total} cells identified; hollow: "
        f"not identified, left out of the fit); {status}."
    )
