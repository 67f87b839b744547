"""Loss against peak LR in every design cell, both arms on one axis: each arm's own tuning.

A design cell is a (rung, budget rank) pair, so "k2-t2" and "k3-t2" share a subplot (the two
archs' ladders have the same rungs; k3scale/scaling/study.py `design_cells`). Per arm: every finished
tuned trial (faint), the trials at the arm's best batch joined by a line (the LR slice through
the landscape), the best trial (large; open when at an edge of the LRs tried) and its seed
re-runs. The reference arm's best LR is the shared setting: a grey dotted line, and the runs of
the other arm at that setting (arm "shared") as black crosses.
"""

from __future__ import annotations

import polars as pl
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import SEED, SHARED, TUNED, best_trials, finished_with

SHARED_COLOUR = "#000000"


def _rung(size: str) -> str:
    return size.rsplit("-", 1)[-1]


def _points(part: pl.DataFrame, metric: str, **style) -> dict:
    return {
        "type": "scatter",
        "x": part["lr"].to_list(),
        "y": part[metric].to_list(),
        "text": [f"b={b} s{s or 0}" for b, s in zip(part["batch_size"], part["seed"])],
        "hovertemplate": "lr %{x:.3g}<br>loss %{y:.4f}<br>%{text}<extra></extra>",
        **style,
    }


def _arm_traces(arm: str, colour: str, tuned: pl.DataFrame, seeds, opt: dict, metric: str):
    at_batch = tuned.filter(pl.col("batch_size") == opt["batch_size"]).sort("lr")
    edge = opt["lr_edge"] is not None
    group = {"legendgroup": arm, "showlegend": False}
    return [
        _points(
            tuned,
            metric,
            mode="markers",
            name=f"{arm} trials",
            opacity=0.35,
            marker={"color": colour, "size": 7},
            **group,
        ),
        _points(
            at_batch,
            metric,
            mode="lines+markers",
            name=f"{arm} at its best batch",
            line={"color": colour, "width": 1.5},
            marker={"color": colour, "size": 7},
            **group,
        ),
        _points(
            seeds,
            metric,
            mode="markers",
            name=f"{arm} seed re-runs",
            marker={"color": colour, "size": 9, "symbol": "circle-open"},
            **group,
        ),
        {
            "type": "scatter",
            "x": [opt["lr"]],
            "y": [opt["loss"]],
            "mode": "markers",
            "name": f"{arm} best (open: at an LR edge)",
            "marker": {
                "color": colour,
                "size": 15,
                "symbol": "diamond-open" if edge else "diamond",
                "line": {"color": colour if edge else "black", "width": 2},
            },
            "hovertemplate": f"{arm} best<br>lr %{{x:.3g}}<br>loss %{{y:.4f}}<extra></extra>",
            "legendgroup": arm,
        },
    ]


def lr_sweep_panel(
    runs: pl.DataFrame,
    arm_key: str,
    reference: str,
    fixed: str,
    metric: str = "final_val_ood_loss",
) -> Panel:
    """Loss vs peak LR per design cell (rows: rungs, columns: budgets), every arm overlaid.

    Args:
        runs: run table.
        arm_key: "schedule" (cosine vs WSD) or "arch" (K2 vs K3): what the arms differ in.
        reference: the arm whose best LR is the shared setting (e.g. "cosine", "k2").
        fixed: the value the arms share of the other key (the arch, or the schedule).
        metric: loss column the tuning minimised.
    """
    other_key = "arch" if arm_key == "schedule" else "schedule"
    runs = runs.filter(pl.col(other_key) == fixed)
    ok = finished_with(runs, metric).with_columns(
        pl.col("size").map_elements(_rung, pl.String).alias("rung"), _budget_level()
    )
    optima = best_trials(runs, metric).with_columns(
        pl.col("size").map_elements(_rung, pl.String).alias("rung"), _budget_level()
    )
    arms = sorted(optima[arm_key].unique().to_list())
    if len(arms) < 2:
        raise K3ScaleError(f"dashboard: the LR sweeps need two {arm_key} values, got {arms}")
    rungs = optima.sort("n_active")["rung"].unique(maintain_order=True).to_list()
    budgets = sorted(optima["level"].unique().to_list())
    fig = make_subplots(
        rows=len(rungs),
        cols=len(budgets),
        subplot_titles=[_title(optima, r, b) for r in rungs for b in budgets],
        shared_xaxes="all",
        vertical_spacing=0.25 / len(rungs),
        horizontal_spacing=0.06,
    )
    colours = theme.arm_colours(arms)
    shown: set[str] = set()
    for opt in optima.sort(arm_key).iter_rows(named=True):
        where = (pl.col("rung") == opt["rung"]) & (pl.col("level") == opt["level"])
        mine = ok.filter(where & (pl.col(arm_key) == opt[arm_key]))
        tuned = mine.filter(pl.col("arm").is_null() | (pl.col("arm") == TUNED))
        seeds = mine.filter(
            (pl.col("arm") == SEED)
            & (pl.col("lr") == opt["lr"])
            & (pl.col("batch_size") == opt["batch_size"])
        )
        arm = opt[arm_key]
        traces = _arm_traces(arm, colours[arm], tuned, seeds, opt, metric)
        shared = mine.filter(pl.col("arm") == SHARED)
        if shared.is_empty() and arm != reference:
            shared = _at_reference_best(tuned, optima, opt, arm_key, reference)
        if shared.height:
            traces.append(
                _points(
                    shared,
                    metric,
                    mode="markers",
                    name=f"{arm} at {reference}'s best (shared setting)",
                    marker={"color": SHARED_COLOUR, "size": 11, "symbol": "x"},
                    legendgroup="shared",
                )
            )
        for t in traces:
            t["showlegend"] = t["legendgroup"] not in shown and t["name"].endswith(
                ("best (open: at an LR edge)", "(shared setting)")
            )
            shown |= {t["legendgroup"]} if t["showlegend"] else set()
        row, col = rungs.index(opt["rung"]) + 1, budgets.index(opt["level"]) + 1
        fig.add_traces(traces, rows=row, cols=col)
        if arm == reference:
            fig.add_vline(
                x=opt["lr"], line={"color": "#888888", "dash": "dot", "width": 1}, row=row, col=col
            )
    fig.update_xaxes(type="log", range=theme.log_range(ok["lr"].to_list()))
    fig.update_xaxes(title_text=theme.LR_TITLE, row=len(rungs))
    fig.update_yaxes(title_text=theme.loss_title(metric), col=1, row=(len(rungs) + 1) // 2)
    # Many arms (the ablation's twelve): the title names their count, the legend them.
    named = " vs ".join(arms) if len(arms) <= 3 else f"{len(arms)} arms against {reference}"
    theme.base_layout(fig, f"Loss vs peak LR per cell, {named}", height=160 + 240 * len(rungs))
    return Panel(
        key=f"lr-sweep-{arm_key}-{fixed}",
        figure=fig,
        caption=_caption(optima, arm_key, reference, arms),
        note=theme.RATIO_NOTE.format(
            ref=f"lr*_{reference}",
            other=" or ".join(f"lr*_{a}" for a in arms if a != reference) or "lr*",
        ),
    )


def _budget_level() -> pl.Expr:
    """A cell's budget rank among its size's budgets: arms pair by (rung, rank), as the analysis
    does (scaling/study.py), so budgets set per parameter (each size its own tokens) pair too."""
    return (
        pl.col("budget_tokens").rank("dense").over(["arch", "size"]).cast(pl.Int64).alias("level")
    )


def _title(optima: pl.DataFrame, rung: str, level: int) -> str:
    budgets = optima.filter((pl.col("rung") == rung) & (pl.col("level") == level))["budget_tokens"]
    if budgets.is_empty():
        return f"{rung}, budget {level}"
    lo, hi = budgets.min(), budgets.max()
    tokens = theme.fmt_sci(lo) if lo == hi else f"{theme.fmt_sci(lo)}-{theme.fmt_sci(hi)}"
    return f"{rung}, D={tokens} tokens"


def _at_reference_best(
    tuned: pl.DataFrame, optima: pl.DataFrame, opt: dict, arm_key: str, reference: str
) -> pl.DataFrame:
    """On a shared LR grid the shared setting is a tuned run: this arm's at the reference arm's
    best (lr, batch) in the same rung and budget level (none on a sampled search)."""
    ref = optima.filter(
        (pl.col("rung") == opt["rung"])
        & (pl.col("level") == opt["level"])
        & (pl.col(arm_key) == reference)
    )
    if ref.is_empty():
        return tuned.head(0)
    best = ref.row(0, named=True)
    return tuned.filter((pl.col("lr") == best["lr"]) & (pl.col("batch_size") == best["batch_size"]))


def _caption(optima: pl.DataFrame, arm_key: str, reference: str, arms: list[str]) -> str:
    wide = optima.pivot(on=arm_key, index=["rung", "level"], values="lr")
    others = [a for a in arms if a != reference]
    ratios = []
    for other in others:
        both = wide.drop_nulls([reference, other])
        values = sorted((both[other] / both[reference]).to_list())
        if values:
            ratios.append(
                f"median best-trial LR {other}/{reference} = {values[len(values) // 2]:.2f} over "
                f"{len(values)} cells (the fitted optima's ratio is the schedule figure's)"
            )
    edges = optima.filter(pl.col("lr_edge").is_not_null()).height
    return (
        f"Final loss vs peak LR of every finished trial, per design cell, {' and '.join(arms)} on "
        f"one axis: each arm's trials (faint), its LR slice at its best batch (line), its best "
        f"trial (diamond; {edges} of {optima.height} at an edge of the LRs tried, open) and seed "
        f"re-runs (open circles); grey dotted line: {reference}'s best LR, the shared setting "
        f"(black crosses: the other arm run there); "
        + ("; ".join(ratios) or "no cell tuned in both arms")
        + "."
    )
