"""The seed-noise picture: how far a second seed at the same setting lands from the first.

Every seed re-run (arm "seed") is paired with the tuned trial it repeats (same cell, LR and
batch, another seed). Their difference has standard deviation sqrt(2) * sigma, where sigma is
the run-to-run noise the comparisons pool (k3scale/scaling/estimates/optimum.py): so sigma is estimated as
the pairs' root mean square over sqrt(2), and about 95% of the pairs should fall inside
+-1.96 * sqrt(2) * sigma (dashed lines).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import SEED, TUNED, finished_with

KEYS = ("arch", "schedule", "size", "budget_tokens", "lr", "batch_size")
Z95 = 1.96


def seed_pairs(runs: pl.DataFrame, metric: str) -> pl.DataFrame:
    """One row per seed re-run: its cell, `label` and `diff` = re-run minus the tuned original."""
    ok = finished_with(runs, metric)
    repeats = ok.filter(pl.col("arm") == SEED).select(
        *KEYS, "n_active", pl.col(metric).alias("rerun")
    )
    originals = (
        ok.filter(pl.col("arm").is_null() | (pl.col("arm") == TUNED))
        .group_by(KEYS)
        .agg(pl.col(metric).first().alias("original"))
    )
    pairs = repeats.join(originals, on=list(KEYS), how="inner")
    return pairs.with_columns(
        (pl.col("rerun") - pl.col("original")).alias("diff"),
        pl.format("{} {} D={}", pl.col("size"), pl.col("schedule"), pl.col("budget_tokens")).alias(
            "label"
        ),
    ).sort("n_active", "budget_tokens", "schedule")


def seed_noise_panel(runs: pl.DataFrame, metric: str) -> Panel:
    """Pair differences per cell with the +-95% band the pooled noise implies."""
    pairs = seed_pairs(runs, metric)
    if pairs.height == 0:
        raise K3ScaleError(
            "dashboard: no seed-noise figure (no seed re-run pairs with a finished original)"
        )
    diffs = pairs["diff"].to_list()
    sigma = math.sqrt(sum(d * d for d in diffs) / len(diffs)) / math.sqrt(2)
    half = Z95 * math.sqrt(2) * sigma
    fig = go.Figure()
    archs = sorted(pairs["arch"].unique().to_list())
    colours = theme.arm_colours(archs)
    # The archs with a colour of their own (k2, k3) drawn last: on top of the variants.
    for arch in sorted(archs, key=lambda a: theme.arm_colour(a) != theme.FALLBACK_COLOUR):
        part = pairs.filter(pl.col("arch") == arch)
        fig.add_trace(
            go.Scatter(
                x=part["label"].to_list(),
                y=part["diff"].to_list(),
                mode="markers",
                name=arch,
                marker={"size": 9, "color": colours[arch]},
                hovertemplate="%{x}<br>second − first %{y:+.4f} nats<extra></extra>",
            )
        )
    for level in (-half, half):
        fig.add_hline(y=level, line={"color": "#777777", "dash": "dash", "width": 1})
    fig.add_hline(y=0.0, line={"color": "#999999", "width": 1})
    lo, hi = min(-half, *diffs), max(half, *diffs)
    pad = 0.08 * (hi - lo)
    fig.update_yaxes(title_text="second seed − first seed (nats/token)", range=[lo - pad, hi + pad])
    fig.update_xaxes(
        title_text="cell (size, schedule, budget) at its best setting", type="category"
    )
    theme.base_layout(fig, "Seed noise: re-runs at each cell's best setting")
    return Panel(
        key="seed-noise",
        figure=fig,
        caption=(
            f"{pairs.height} seed re-run pairs, {sum(d > 0 for d in diffs)} above their first run; "
            f"run-to-run noise sigma = {sigma:.3g} nats (pairs' RMS / √2); dashed: ±{half:.3g}, "
            "where 95% of pair differences fall if the noise is that alone. The first run is "
            "the tuning trial the study picked for being lowest, on the tuning seed: a "
            "difference holds that selection and the tuning seed's own luck, which the report's "
            "seed-effects line measures apart."
        ),
        note="Sign convention: second seed − first seed at the same cell, LR and batch.",
    )
