"""Cosine vs WSD per cell, drawn from the report's schedule comparison (methods.md 3.4).

Bottom row: reference − other (the sign `k3scale fit` reports) in each (arch, size, budget)
cell at each schedule's own fitted optimum and at the reference's optimum, and their mean pooled
over cells (right), each with its stored 95% interval and verdict: exactly the numbers of
`results.schedule_comparison` (k3scale/scaling/estimates/schedule_compare.py), hover text in the report's
words. Top row: each schedule's fitted optimum loss with its interval, and the runs at its best
trial as plain dots (no interval, no verdict: the report puts none on them). Nothing is
estimated here; without a fit file there is no comparison to draw (issue 32).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.scaling.headline import shared_text
from k3scale.scaling.values.fitdoc import (
    CellDifference,
    CellOptimumRecord,
    PooledDifference,
    ScheduleComparison,
    sign_of,
)
from k3scale.scaling.values.text import diff_text, interval, reason_text
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.viz import theme
from k3scale.viz.fits import DashboardFits
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import cell_label

# The two readings of a cell (CellDifference.own / .shared): colour, symbol and legend name.
READINGS = {
    "own": ("#000000", "circle", "at each schedule's own optimum"),
    "shared": ("#7f7f7f", "diamond", "at {ref}'s optimum"),
}
POOLED_COLOUR = "#d62728"
INTERVAL_SOURCE = "95% intervals from each cell optimum's sampling distribution"


def _has_bar(e: Estimate) -> bool:
    return e.identified and e.value is not None and bool(e.interval)


def _bars(estimates: list[Estimate]) -> dict:
    """Error bars of the identified estimates; none (not a zero bar) on the others."""
    good = [_has_bar(e) for e in estimates]
    return {
        "type": "data",
        "array": [e.interval[1] - e.value if ok else None for e, ok in zip(estimates, good)],
        "arrayminus": [e.value - e.interval[0] if ok else None for e, ok in zip(estimates, good)],
        "visible": True,
    }


def _label(cell: dict) -> str:
    return cell_label(cell["size"], cell["budget_tokens"])


def _reading_traces(cells: list[CellDifference], reading: str, ref: str) -> list[go.Scatter]:
    """One reading of every cell: identified filled with bars, the others hollow (hover: why)."""
    colour, symbol, name = READINGS[reading]
    name = f"{ref} − {cells[0].other} {name.format(ref=ref)}"
    traces = []
    for identified in (True, False):
        part = [d for d in cells if getattr(d, reading).identified == identified]
        part = [d for d in part if getattr(d, reading).value is not None]
        if not part:
            continue
        estimates = [getattr(d, reading) for d in part]
        text = [diff_text(d.own) if reading == "own" else shared_text(d) for d in part]
        traces.append(
            go.Scatter(
                x=[_label(d.cell) for d in part],
                y=[e.value for e in estimates],
                mode="markers",
                name=name + ("" if identified else ", not identified"),
                legendgroup=reading,
                offsetgroup=reading,
                marker={
                    "color": colour,
                    "size": 11,
                    "symbol": symbol + ("" if identified else "-open"),
                    "line": {"color": colour, "width": 2},
                },
                error_y=_bars(estimates),
                text=text,
                hovertemplate="%{x}: %{text}<extra></extra>",
            )
        )
    return traces


def _pooled_trace(other: str, p: PooledDifference, ref: str) -> go.Scatter:
    return go.Scatter(
        x=[f"pooled, {other}"],
        y=[p.mean.value],
        mode="markers",
        name=f"{ref} − {other} pooled over {p.identified_cells} of {p.cells} cells",
        marker={"color": POOLED_COLOUR, "size": 9, "symbol": "square"},
        error_y=_bars([p.mean]),
        text=[f"{diff_text(p.mean)} ({sign_of(p.mean.interval, ref, other)}); {p.method}"],
        hovertemplate="%{text}<extra></extra>",
    )


def _optimum_traces(schedule: str, optima: list[CellOptimumRecord]) -> list[go.Scatter]:
    """A schedule's fitted optimum loss per cell (as the frontier figure draws it), and the runs
    at its best trial: plain dots, since the report puts no interval on them."""
    colour = theme.SCHEDULE_COLOURS.get(schedule, theme.FALLBACK_COLOUR)
    symbol = theme.SCHEDULE_SYMBOL.get(schedule, "square")
    labels = [_label(o.cell) for o in optima]
    fitted = go.Scatter(
        x=labels,
        y=[o.loss.value for o in optima],
        mode="markers",
        name=f"{schedule} fitted optimum (open: not identified)",
        legendgroup=schedule,
        offsetgroup=schedule,
        marker=theme.estimate_marker(colour, symbol, [o.loss.identified for o in optima]),
        error_y=_bars([o.loss for o in optima]),
        text=[optimum_text(o) for o in optima],
        hovertemplate="%{x}<br>%{text}<extra></extra>",
    )
    runs = [(label, loss) for label, o in zip(labels, optima) for loss in _run_losses(o)]
    raw = go.Scatter(
        x=[label for label, _ in runs],
        y=[loss for _, loss in runs],
        mode="markers",
        name=f"{schedule} runs at its best trial",
        legendgroup=schedule,
        offsetgroup=schedule,
        marker={"color": colour, "size": 5, "opacity": 0.5},
        hovertemplate="%{x}<br>run at the best trial: %{y:.4f}<extra></extra>",
    )
    return [fitted, raw]


def _run_losses(o: CellOptimumRecord) -> list[float]:
    return [o.best_trial["loss"], *o.seed_losses]


def _loss(value: float) -> str:
    return f"{value:.3f}"


def optimum_text(o: CellOptimumRecord) -> str:
    """An optimum's loss as the report's optima table prints it (3 decimals): value and
    interval where identified, else why."""
    if _has_bar(o.loss):
        return f"fitted optimum {_loss(o.loss.value)} {interval(o.loss.interval, _loss)}"
    return f"fitted optimum {reason_text(o.loss.verdict)}"


def _cell_optima(
    fits: DashboardFits, cells: list[CellDifference], schedule: str
) -> list[CellOptimumRecord]:
    """The optimum records of `schedule` in the compared cells, in the comparison's order."""
    found = []
    for d in cells:
        match = {k: d.cell[k] for k in ("arch", "size", "budget_tokens")}
        found += fits.optima(schedule=schedule, **match)
    return found


def schedule_comparison_panel(fits: DashboardFits) -> Panel:
    """The report's schedule comparison: per cell and pooled differences, and the optima.

    Raises:
        K3ScaleError: no fit file, or one without a schedule comparison (the page lists why).
    """
    comparison = fits.schedule_comparison
    if comparison is None:
        if not fits.cell_optima:
            raise K3ScaleError(
                "dashboard: the schedule comparison is the report's: it needs `--fit` "
                "(the artifact of `k3scale fit cosine_vs_wsd`)"
            )
        raise K3ScaleError(
            f"dashboard: the fit file ({fits.analysis}) holds no schedule comparison"
        )
    if not comparison.cells:
        raise K3ScaleError("dashboard: no cell has trials of both schedules to compare")
    ref = comparison.reference
    others = sorted({d.other for d in comparison.cells})
    fig = make_subplots(
        rows=2,
        cols=2,
        column_widths=[0.86, 0.14],
        # The top row over the cells' column only, so each cell's loss sits above its difference.
        specs=[[{}, None], [{}, {}]],
        vertical_spacing=0.1,
        horizontal_spacing=0.03,
        subplot_titles=("fitted optimum loss per schedule", "difference per cell", "pooled"),
    )
    optima = []
    for schedule in [ref, *others]:
        mine = _cell_optima(fits, comparison.cells, schedule)
        fig.add_traces(_optimum_traces(schedule, mine), rows=1, cols=1)
        optima += mine
    diffs: list[Estimate] = []
    for other in others:
        cells = [d for d in comparison.cells if d.other == other]
        for reading in READINGS:
            fig.add_traces(_reading_traces(cells, reading, ref), rows=2, cols=1)
        diffs += [e for d in cells for e in (d.own, d.shared)]
        pooled = comparison.pooled.get(other)
        if pooled is not None and pooled.mean.value is not None:
            fig.add_trace(_pooled_trace(other, pooled, ref), row=2, col=2)
            diffs.append(pooled.mean)
        elif pooled is not None:
            # Nothing to draw: the subplot says so, the caption says why. Paper coordinates,
            # since plotly.js draws no axes for a subplot without traces.
            fig.add_annotation(
                text=f"{other}: not identified<br>(see caption)",
                showarrow=False,
                x=sum(fig.layout.xaxis3.domain) / 2,
                y=sum(fig.layout.yaxis3.domain) / 2,
                xref="paper",
                yref="paper",
                xanchor="center",
            )
    _axes(fig, optima, diffs, fits.loss)
    title = f"{ref} vs {', '.join(others)} per cell, as the report compares them"
    theme.base_layout(fig, title, height=680)
    # Side by side within a cell: one offset per schedule (top) and per reading (bottom).
    fig.update_layout(scattermode="group", scattergap=0.6)
    bars = any(_has_bar(e) for e in [*diffs, *(o.loss for o in optima)])
    return Panel(
        key="schedules",
        figure=fig,
        caption=_caption(comparison, bars),
        note=theme.DIFF_NOTE.format(ref=ref, other="/".join(others)),
    )


def _span(estimates: list[Estimate]) -> list[float]:
    """Every value and drawn interval end, for an axis range."""
    return [v for e in estimates for v in (e.value, *(e.interval if _has_bar(e) else ()))]


def _axes(
    fig: go.Figure, optima: list[CellOptimumRecord], diffs: list[Estimate], loss: str
) -> None:
    # Each y axis spans its own points, intervals and (for differences) zero: grouped scatter
    # would autorange from zero, flattening loss gaps of a few hundredths.
    losses = _span([o.loss for o in optima]) + [v for o in optima for v in _run_losses(o)]
    fig.update_yaxes(range=theme.linear_range(losses), row=1, col=1)
    fig.update_yaxes(title_text=theme.loss_title(loss or "final_val_ood_loss"), row=1, col=1)
    differences = theme.linear_range([0.0, *_span(diffs)])
    fig.update_yaxes(range=differences, title_text=f"difference ({theme.LOSS_UNIT})", row=2, col=1)
    # The pooled mean on the cells' scale, so the two read against each other.
    fig.update_yaxes(range=differences, matches="y2", showticklabels=False, row=2, col=2)
    for col in (1, 2):
        fig.add_hline(y=0.0, line={"color": "#999999", "width": 1}, row=2, col=col)
    fig.update_xaxes(matches="x2", showticklabels=False, row=1, col=1)
    fig.update_xaxes(title_text="cell (model size, token budget D in tokens)", row=2, col=1)


def _reasons(comparison: ScheduleComparison) -> dict[str, list[str]]:
    """Why a difference is not identified -> the cells it says so of (a shared reading that
    fails for the own reading's reason is not counted twice, as the report prints it)."""
    reasons: dict[str, list[str]] = {}
    for d in comparison.cells:
        rulings = {d.own.verdict, d.shared.verdict}
        for ruling in rulings:
            if not ruling.identified:
                reasons.setdefault(reason_text(ruling), []).append(_label(d.cell))
    return reasons


def _caption(comparison: ScheduleComparison, bars: bool) -> str:
    ref = comparison.reference
    parts = []
    for other in sorted(comparison.pooled):
        cells = [d for d in comparison.cells if d.other == other]
        own = sum(d.own.identified for d in cells)
        shared = sum(d.shared.identified for d in cells)
        p = comparison.pooled[other]
        pooled = (
            f"pooled over {p.identified_cells} of {p.cells} cells: {diff_text(p.mean)} "
            f"({sign_of(p.mean.interval, ref, other)}; {p.method})"
            if p.mean.identified
            else f"pooled over cells: {reason_text(p.mean.verdict)}"
        )
        parts.append(
            f"{ref} − {other} at own optima identified in {own} of {len(cells)} cells, at "
            f"{ref}'s optimum in {shared} of {len(cells)}; {pooled}"
        )
    parts += [
        f"{why} in {len(cells)} cell(s) ({' | '.join(cells)})"
        for why, cells in _reasons(comparison).items()
    ]
    drawn = f"bars: {INTERVAL_SOURCE}; " if bars else "no interval to draw; "
    return (
        f"The report's schedule comparison (`k3scale fit`), final loss {ref} minus other per "
        f"cell and pooled ({drawn}hollow: not identified, hover: why); top: each schedule's "
        f"fitted optimum loss and the runs at its best trial (dots, no interval): "
        + "; ".join(parts)
        + "."
    )
