"""Fitted optimum peak LR and batch vs compute per (arch, schedule), with the HP laws of
`k3scale fit` (per schedule, through its identified cell optima) drawn as stored, never refitted.

The points are the cell optima the laws were fitted through (`CellOptimumRecord.lr_opt`,
`batch_opt`): filled where identified, hollow where not (those the laws leave out).
"""

from __future__ import annotations

import statistics

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.scaling.values.fitdoc import CellOptimumRecord
from k3scale.scaling.values.result import FitResult
from k3scale.viz import theme
from k3scale.viz.fits import DashboardFits
from k3scale.viz.frontier import optimum_hover
from k3scale.viz.panel import Panel

# hp_laws target -> its axis title; the batch optimum is in the study's batch column (tokens).
TARGETS = (("lr_opt", theme.LR_TITLE), ("batch_opt", theme.BATCH_TOKENS_TITLE))


def _law_trace(
    schedule: str, law: FitResult, colour: str, span: tuple[float, float], col: int
) -> go.Scatter:
    """The stored law y = k C^exp_C over the compute of its schedule's cells."""
    x = np.geomspace(span[0], span[1], 50)
    exponent = law.params["exp_C"]
    return go.Scatter(
        x=x,
        y=law.params["k"] * x**exponent,
        mode="lines",
        name=f"{schedule} law ∝ C^{exponent:.3f}",
        legendgroup=f"{schedule} law",
        line={"color": colour, "dash": theme.SCHEDULE_DASH.get(schedule, "dot")},
        showlegend=col == 1,
    )


def _optimum_trace(
    part: list[CellOptimumRecord], target: str, compute: str, style: dict, col: int
) -> go.Scatter:
    identified = [o.loss.identified for o in part]
    return go.Scatter(
        x=[o.compute[compute] for o in part],
        y=[getattr(o, target) for o in part],
        mode="markers",
        name=f"{style['name']} fitted optima (open: not identified)",
        legendgroup=style["name"],
        showlegend=col == 1,
        marker=theme.estimate_marker(style["colour"], style["symbol"], identified),
        text=[f"{optimum_hover(o)} ({o.mode})" for o in part],
        hovertemplate="%{text}<br>C %{x:.3s} FLOPs<br>%{y:.4g}<extra></extra>",
    )


def hp_optima_panel(fits: DashboardFits, compute: str = "c_6n") -> Panel:
    """Per-cell fitted optimum LR and batch (tokens/step) vs compute, laws y = k C^b where fitted.

    Args:
        fits: fit results (cell optima, and `hp_laws` where fitted).
        compute: FLOP convention of the x axis (c_6n or c_attn).

    Raises:
        K3ScaleError: no fit file (the points are the fit's optima).
    """
    optima = [o for o in fits.cell_optima if compute in o.compute]
    if not optima:
        raise K3ScaleError(
            "dashboard: the HP figure draws the cell optima of `k3scale fit` (no fit file given)"
        )
    groups: dict[tuple[str, str], list[CellOptimumRecord]] = {}
    for o in optima:
        groups.setdefault((o.cell["arch"], o.cell["schedule"]), []).append(o)
    multi_arch = len({arch for arch, _ in groups}) > 1
    # A setting the design fixed (the v2 and v3 grids fix the batch) gets no panel: a constant
    # drawn as a figure reads as a finding.
    fixed = {t: vs.pop() for t, _ in TARGETS if len(vs := {getattr(o, t) for o in optima}) == 1}
    targets = [(t, title) for t, title in TARGETS if t not in fixed or t == "lr_opt"]
    fig = make_subplots(rows=1, cols=len(targets), horizontal_spacing=0.1)
    for (arch, schedule), part in sorted(groups.items()):
        style = theme.group_style(arch, schedule, multi_arch)
        for col, (target, _) in enumerate(targets, start=1):
            fig.add_trace(_optimum_trace(part, target, compute, style, col), row=1, col=col)
    for schedule in sorted({s for _, s in groups}):
        # A law pools the schedule's archs: the schedule's colour when it is alone, else grey.
        colour = theme.FALLBACK_COLOUR if multi_arch else theme.arm_colour(schedule)
        xs = [o.compute[compute] for o in optima if o.cell["schedule"] == schedule]
        for col, (target, _) in enumerate(targets, start=1):
            law = fits.hp_law(schedule, target, compute)
            if law is not None:
                fig.add_trace(
                    _law_trace(schedule, law, colour, (min(xs), max(xs)), col), row=1, col=col
                )
    fig.update_xaxes(type="log", title_text=theme.compute_title(compute))
    computes = {o.compute[compute] for o in optima}
    if len(computes) == 1:
        # One compute (the demo's single rung): plotly would pad it by a decade each way.
        fig.update_xaxes(range=theme.log_range(list(computes), pad=0.2))
    for col, (target, title) in enumerate(targets, start=1):
        fig.update_yaxes(type="log", title_text=title, row=1, col=col)
        values = [getattr(o, target) for o in optima]
        if len(set(values)) == 1:
            fig.update_yaxes(range=theme.log_range(values, pad=0.2), row=1, col=col)
    named = " and batch" if len(targets) == 2 else ""
    theme.base_layout(fig, f"Fitted optimum peak LR{named} vs compute")
    ratios = schedule_lr_ratios(fits)
    note = theme.RATIO_NOTE.format(ref="lr_opt cosine", other="lr_opt WSD") if ratios else ""
    return Panel(
        key=f"hp-optima-{compute}",
        figure=fig,
        caption=_caption(optima, fits, compute, ratios, fixed.get("batch_opt")),
        note=note,
    )


def schedule_lr_ratios(fits: DashboardFits) -> list[float]:
    """The report's lr_opt ratio (other / reference schedule) of every cell whose own-optima
    difference is identified (both optima identified, with an interval)."""
    comparison = fits.schedule_comparison
    if comparison is None:
        return []
    return [d.lr_ratio for d in comparison.cells if d.own.identified]


def _caption(
    optima: list[CellOptimumRecord],
    fits: DashboardFits,
    compute: str,
    ratios: list[float],
    fixed_batch: float | None,
) -> str:
    found = sum(o.loss.identified for o in optima)
    what = "peak LR" if fixed_batch is not None else "(peak LR, batch)"
    parts = [
        f"Fitted optimum {what} of `k3scale fit` in each of {len(optima)} cells vs "
        f"compute ({found} identified; hollow: not identified, left out of the laws; hover: why)"
    ]
    if fixed_batch is not None:
        parts.append(f"the batch is fixed by the design at {fixed_batch:,.0f} tokens per step")
    schedules = sorted({o.cell["schedule"] for o in optima})
    laws = [(s, law) for s in schedules if (law := fits.hp_law(s, "lr_opt", compute))]
    if laws:
        exps = "; ".join(
            f"{schedule} lr_opt ∝ C^{law.params['exp_C']:.3f}"
            + (f" {theme.fmt_interval(*ci)}" if (ci := law.intervals.get("exp_C")) else "")
            for schedule, law in laws
        )
        parts.append(f"HP laws of `k3scale fit` (per schedule, its identified cell optima): {exps}")
    else:
        parts.append("no HP law in the fit file")
    if ratios:
        reference = fits.schedule_comparison.reference
        others = "/".join(sorted({d.other for d in fits.schedule_comparison.cells}))
        parts.append(
            f"median lr_opt {others}/{reference} = {statistics.median(ratios):.2f} over the "
            f"{len(ratios)} cells whose comparison is identified (the report's lr_opt ratio)"
        )
    return "; ".join(parts) + "."
