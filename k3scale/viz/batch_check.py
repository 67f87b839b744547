"""The batch sensitivity check as one figure: loss against peak LR at each batch size tried.

Per batch: the grid trials joined by a line, the re-runs at its best grid LR (open circles), the
fitted quadratic over the LRs tried (dashed) and its minimum (diamond: the fitted optimum the
check's table reports). Reads `k3scale.scaling.batch_check.compare_batches` output and the run
table it came from.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from k3scale.scaling.study import SEED
from k3scale.track import schema
from k3scale.viz import theme
from k3scale.viz.panel import Panel

# Batch colours: the smallest to the largest, the reference in black.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")


def batch_check_panel(runs: pl.DataFrame, result: dict) -> Panel:
    ref = result["reference_batch"]
    runs = runs.filter(pl.col("status") == schema.STATUS_FINISHED)
    fig = go.Figure()
    colours = iter(PALETTE)
    for row in result["batches"]:
        batch = row["batch_size"]
        colour = "#000000" if batch == ref else next(colours)
        at_batch = runs.filter(pl.col("batch_size") == batch).sort("lr")
        for trace in _traces(at_batch, row, result["loss"], colour):
            fig.add_trace(trace)
    size = result["batches"][0]["size"]
    theme.base_layout(fig, f"{size}: loss vs peak LR at each batch size (reference: batch {ref})")
    fig.update_xaxes(type="log", title=theme.LR_TITLE)
    fig.update_yaxes(title=theme.loss_title(result["loss"]))
    bound = max(gain["nats"] for gain in result["largest_gain"].values())
    caption = (
        f"Another batch could have lowered the loss at {size} by at most {bound:.3f} nats "
        f"(95%, by fitted optima or re-run means) against batch {ref}"
    )
    return Panel("batch-check", fig, caption)


def _traces(at_batch: pl.DataFrame, row: dict, metric: str, colour: str) -> list[go.Scatter]:
    name = f"batch {row['batch_size']} ({row['steps']} steps)"
    tuned = at_batch.filter(pl.col("arm") != SEED)
    reruns = at_batch.filter(pl.col("arm") == SEED)
    group = {"legendgroup": name}
    traces = [
        go.Scatter(
            x=tuned["lr"].to_list(),
            y=tuned[metric].to_list(),
            mode="lines+markers",
            name=name,
            line={"color": colour, "width": 1.5},
            marker={"color": colour, "size": 8},
            **group,
        ),
        go.Scatter(
            x=reruns["lr"].to_list(),
            y=reruns[metric].to_list(),
            mode="markers",
            name=f"{name}: re-runs",
            marker={"color": colour, "size": 9, "symbol": "circle-open"},
            showlegend=False,
            **group,
        ),
    ]
    coef = row.get("fit_coef")
    if coef is not None:
        u = np.linspace(np.log(min(row["lrs"])), np.log(max(row["lrs"])), 60)
        traces.append(
            go.Scatter(
                x=np.exp(u).tolist(),
                y=(coef[0] + coef[1] * u + coef[2] * u * u).tolist(),
                mode="lines",
                name=f"{name}: fitted quadratic",
                line={"color": colour, "dash": "dash", "width": 1},
                showlegend=False,
                **group,
            )
        )
    traces.append(
        go.Scatter(
            x=[row["optimum_lr"]],
            y=[row["optimum_loss"]],
            mode="markers",
            name=f"{name}: fitted optimum",
            marker={"color": colour, "size": 13, "symbol": "diamond"},
            showlegend=False,
            **group,
        )
    )
    return traces
