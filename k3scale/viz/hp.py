"""Tuned optimum peak LR and batch vs compute per (arch, schedule), with fitted HP laws."""

from __future__ import annotations

import math
import statistics

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.fits import DashboardFits, HPLaw
from k3scale.viz.frontier import band_traces, clip_band
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import cell_optima

TARGETS = (("lr", theme.LR_TITLE), ("batch_tokens", theme.BATCH_TOKENS_TITLE))


def _law_traces(law: HPLaw, style: dict, span: tuple[float, float], col: int) -> list:
    """The fitted law and its band over the compute of the cells it was fitted to."""
    x = np.geomspace(span[0], span[1], 50)
    traces = (
        band_traces(clip_band(law.band, *span), style["colour"], style["name"]) if law.band else []
    )
    traces.append(
        go.Scatter(
            x=x,
            y=law.predict(x),
            mode="lines",
            name=f"{style['name']} law ∝ C^{law.exponent:.3f}",
            legendgroup=style["name"],
            line={"color": style["colour"], "dash": style["dash"]},
            showlegend=col == 1,
        )
    )
    return traces


def _optimum_trace(part: pl.DataFrame, target: str, compute: str, style: dict, col: int):
    edge_col = "lr_edge" if target == "lr" else "batch_edge"
    edge = part[edge_col].is_not_null().to_list()
    return go.Scatter(
        x=part[compute].to_list(),
        y=part[target].to_list(),
        mode="markers",
        name=f"{style['name']} optima (open: at range edge)",
        legendgroup=style["name"],
        showlegend=col == 1,
        marker={
            "color": style["colour"],
            "symbol": [style["symbol"] + ("-open" if e else "") for e in edge],
            "size": 11,
            "line": {"width": 2, "color": style["colour"]},
        },
        text=[f"{c} ({e or 'inside range'})" for c, e in zip(part["cell"], part[edge_col])],
        hovertemplate="%{text}<br>C %{x:.3s} FLOPs<br>%{y:.4g}<extra></extra>",
    )


def hp_optima_panel(
    runs: pl.DataFrame,
    fits: DashboardFits,
    metric: str = "final_val_ood_loss",
    compute: str = "c_6n",
) -> Panel:
    """Per-cell optimum LR and batch (tokens/step) vs compute, laws y = coef C^b where fitted.

    Args:
        runs: run table.
        fits: fit results (`hp_laws` used when present).
        metric: objective column.
        compute: compute column for the x axis (c_6n or c_attn).
    """
    optima = cell_optima(runs, metric)
    if optima.is_empty():
        raise K3ScaleError("dashboard: no finished tuned runs to take optima from")
    multi_arch = optima["arch"].n_unique() > 1
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1)
    span = (optima[compute].min(), optima[compute].max())
    for (arch, schedule), part in optima.group_by("arch", "schedule", maintain_order=True):
        style = theme.group_style(arch, schedule, multi_arch)
        for col, (target, _) in enumerate(TARGETS, start=1):
            fig.add_trace(_optimum_trace(part, target, compute, style, col), row=1, col=col)
            law = fits.hp_law(arch, schedule, target, compute)
            if law is not None:
                for trace in _law_traces(law, style, span, col):
                    fig.add_trace(trace, row=1, col=col)
    fig.update_xaxes(type="log", title_text=theme.compute_title(compute))
    for col, (target, title) in enumerate(TARGETS, start=1):
        fig.update_yaxes(type="log", title_text=title, row=1, col=col)
        values = optima[target].drop_nulls()
        if values.n_unique() == 1:
            # A fixed setting (the v2 designs fix the batch): plotly would pad one value by a
            # decade each way; a narrow range keeps the point readable as a constant.
            fig.update_yaxes(range=theme.log_range(values.to_list(), pad=0.2), row=1, col=col)
    theme.base_layout(fig, "Tuned optimum peak LR and batch vs compute")
    note = ""
    if schedule_lr_ratios(optima):
        note = theme.RATIO_NOTE.format(ref="lr*_cosine", other="lr*_WSD")
    return Panel(
        key=f"hp-optima-{compute}",
        figure=fig,
        caption=_caption(optima, fits, compute),
        note=note,
    )


def schedule_lr_ratios(optima: pl.DataFrame) -> list[float]:
    """lr*_WSD / lr*_cosine for every (arch, size, budget) with both schedules tuned."""
    wide = optima.pivot(on="schedule", index=["arch", "size", "budget_tokens"], values="lr")
    if not {"cosine", "wsd"} <= set(wide.columns):
        return []
    ratios = (wide["wsd"] / wide["cosine"]).drop_nulls().to_list()
    return [r for r in ratios if math.isfinite(r)]


def _caption(optima: pl.DataFrame, fits: DashboardFits, compute: str) -> str:
    edges = optima.filter(pl.col("lr_edge").is_not_null()).height
    parts = [
        f"Best (peak LR, batch) of each of {optima.height} cells vs compute "
        f"({edges} LR optima at the edge of the values tried, open markers)"
    ]
    laws = [law for law in fits.hp_laws if law.target == "lr" and law.compute == compute]
    if laws:
        exps = "; ".join(
            f"{law.arch} {law.schedule} lr* ∝ C^{law.exponent:.3f}"
            + (f" {theme.fmt_interval(*law.exponent_interval)}" if law.exponent_interval else "")
            for law in laws
        )
        parts.append(f"fitted {exps}")
    else:
        parts.append("no HP laws in the fit file")
    ratios = schedule_lr_ratios(optima)
    if ratios:
        parts.append(
            f"median lr*_WSD/lr*_cosine = {statistics.median(ratios):.2f} over {len(ratios)} cells"
        )
    return "; ".join(parts) + "."
