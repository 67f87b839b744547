"""Cosine vs WSD per cell: loss at each schedule's own tuned optimum and at one shared setting.

Left column: each schedule at its own optimum (methods.md 3.4, the K3 report's design). Right
column: the shared arm, WSD re-run at cosine's optimum (the design methods.md 3.2 argues is
biased). Top row: loss per schedule with 95% t-intervals over seeds; bottom row: cosine − WSD
(reference − other, the sign `k3scale fit` reports) with a Welch interval where both sides have
two or more runs.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import (
    best_point_losses,
    cell_label,
    difference_interval,
    shared_losses,
)

BASELINE, OTHER = "cosine", "wsd"


def _error(mean: list[float], lo: list[float], hi: list[float]) -> dict:
    """Error bars; a point without an interval (one run) gets none rather than a zero bar."""
    up = [h - m if math.isfinite(h) else None for m, h in zip(mean, hi)]
    down = [m - low if math.isfinite(low) else None for m, low in zip(mean, lo)]
    return {"type": "data", "array": up, "arrayminus": down, "visible": True}


def _pairs(own: pl.DataFrame, other: pl.DataFrame) -> list[dict]:
    """Rows of cosine (own optimum) matched with the other schedule's row of the same cell."""
    base = own.filter(pl.col("schedule") == BASELINE)
    pairs = []
    for row in base.sort("n_active", "budget_tokens").iter_rows(named=True):
        match = other.filter(
            (pl.col("schedule") == OTHER)
            & (pl.col("size") == row["size"])
            & (pl.col("budget_tokens") == row["budget_tokens"])
        )
        if match.height:
            diff = difference_interval(row["values"], match["values"][0].to_list())
            pairs.append(
                {
                    "label": cell_label(row["size"], row["budget_tokens"]),
                    "base": row,
                    "other": match.row(0, named=True),
                    "diff": diff,
                    "rel": diff[0] / row["mean"],
                }
            )
    return pairs


def _column(fig: go.Figure, pairs: list[dict], col: int, other_name: str) -> None:
    labels = [p["label"] for p in pairs]
    for key, name in (("base", f"{BASELINE} at own optimum"), ("other", other_name)):
        sched = BASELINE if key == "base" else OTHER
        rows = [p[key] for p in pairs]
        mean = [r["mean"] for r in rows]
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=mean,
                mode="markers",
                name=name,
                marker={
                    "color": theme.SCHEDULE_COLOURS[sched],
                    "symbol": theme.SCHEDULE_SYMBOL[sched],
                    "size": 11,
                },
                error_y=_error(mean, [r["lo"] for r in rows], [r["hi"] for r in rows]),
                text=[
                    f"{r['num_seeds']} seed(s), lr {r['lr']:.3g}, b {r['batch_size']}" for r in rows
                ],
                hovertemplate="%{x}<br>%{y:.4f}<br>%{text}<extra></extra>",
                offsetgroup=key,
                legendgroup=name,
                showlegend=key == "other" or col == 1,
            ),
            row=1,
            col=col,
        )
    diff = [p["diff"] for p in pairs]
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=[d[0] for d in diff],
            mode="markers",
            name=f"{BASELINE} − {OTHER} ({'own optima' if col == 1 else 'shared setting'})",
            marker={"color": "black", "size": 10, "symbol": "square"},
            error_y=_error([d[0] for d in diff], [d[1] for d in diff], [d[2] for d in diff]),
        ),
        row=2,
        col=col,
    )
    fig.add_hline(y=0.0, line={"color": "#999999", "width": 1}, row=2, col=col)


def schedule_comparison_panel(
    runs: pl.DataFrame, arch: str, metric: str = "final_val_ood_loss"
) -> Panel:
    """Side-by-side cosine vs WSD losses of `arch`'s cells, own optima | shared setting."""
    part = runs.filter(pl.col("arch") == arch)
    own = best_point_losses(part, metric)
    if own.is_empty() or own["schedule"].n_unique() < 2:
        raise K3ScaleError(f"dashboard: {arch} needs tuned cosine and WSD cells to compare")
    own_pairs = _pairs(own, own)
    shared = shared_losses(part, metric)
    shared_pairs = _pairs(own, shared) if shared.height else []
    fig = make_subplots(
        rows=2,
        cols=2,
        shared_xaxes=True,
        row_heights=[0.6, 0.4],
        vertical_spacing=0.08,
        subplot_titles=(
            "each schedule at its own tuned optimum",
            f"shared setting: {OTHER} at {BASELINE}'s optimum",
            "",
            "",
        ),
    )
    _column(fig, own_pairs, 1, f"{OTHER} at own optimum")
    if shared_pairs:
        _column(fig, shared_pairs, 2, f"{OTHER} at {BASELINE}'s optimum")
    # Grouped scatter autoranges from zero, which flattens loss gaps of a few hundredths.
    # Each subplot's y axis spans its own points, intervals and (for differences) zero.
    for col, pairs in ((1, own_pairs), (2, shared_pairs)):
        if pairs:
            fig.update_yaxes(range=_loss_range(pairs), row=1, col=col)
            diffs = [v for p in pairs for v in p["diff"]]
            fig.update_yaxes(range=theme.linear_range([*diffs, 0.0]), row=2, col=col)
    fig.update_yaxes(title_text=theme.loss_title(metric), row=1, col=1)
    fig.update_yaxes(title_text=f"{BASELINE} − {OTHER} ({theme.LOSS_UNIT})", row=2, col=1)
    fig.update_xaxes(title_text="cell (model size, token budget D in tokens)", row=2)
    # Side by side within a cell: cosine left, WSD right.
    fig.update_layout(scattermode="group", scattergap=0.7)
    theme.base_layout(fig, f"Cosine vs WSD, {arch}", height=620)
    bars = _num_bars(own_pairs) + _num_bars(shared_pairs)
    caption = (
        f"{arch}: {_summary(own_pairs, 'at own optima')}; "
        + (_summary(shared_pairs, "at the shared setting") if shared_pairs else "no shared arm")
        + (
            f" (bars: 95% t-intervals over seeds on {bars} points; a point from one run has none)."
            if bars
            else " (one run per point: no intervals drawn)."
        )
    )
    note = theme.DIFF_NOTE.format(ref=BASELINE, other=OTHER)
    return Panel(key=f"schedules-{arch}", figure=fig, caption=caption, note=note)


def _num_bars(pairs: list[dict]) -> int:
    """Points of the figure that carry an interval (loss per schedule and the difference)."""
    rows = [r for p in pairs for r in (p["base"], p["other"])]
    return sum(math.isfinite(r["lo"]) for r in rows) + sum(
        math.isfinite(p["diff"][1]) for p in pairs
    )


def _loss_range(pairs: list[dict]) -> list[float]:
    """Top-row y range: every mean and finite interval bound, with 5% margin."""
    values = [
        v
        for p in pairs
        for row in (p["base"], p["other"])
        for v in (row["mean"], row["lo"], row["hi"])
        if math.isfinite(v)
    ]
    pad = 0.05 * (max(values) - min(values) or 1.0)
    return [min(values) - pad, max(values) + pad]


def _summary(pairs: list[dict], where: str) -> str:
    diffs = [p["diff"][0] for p in pairs]
    rel = [p["rel"] for p in pairs]
    wins = sum(d < 0 for d in diffs)
    with_interval = [p for p in pairs if math.isfinite(p["diff"][1])]
    clear = sum(p["diff"][2] < 0 for p in with_interval)
    intervals = (
        f"{clear} of {len(with_interval)} intervals below 0"
        if with_interval
        else "no intervals: one run per cell"
    )
    return (
        f"{BASELINE} − {OTHER} {where} averages {sum(diffs) / len(diffs):+.4f} {theme.LOSS_UNIT} "
        f"({100 * sum(rel) / len(rel):+.2f}%), cosine lower in {wins}/{len(pairs)} cells "
        f"({intervals})"
    )
