"""WSD trunks and their decay branches: peak-LR schedule and loss against tokens, one trunk at a
time (a menu). A branch (a run with `trunk_run_id`) resumes its trunk at `fork_step` and decays
to its own, smaller budget; its curve table holds only the steps after the fork."""

from __future__ import annotations

import plotly.colors
import polars as pl
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.curves import run_label
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import require_columns

TRUNK_COLOUR = "#333333"
ROWS = (("lr", "learning rate (per step)"), ("train/loss", f"loss ({theme.LOSS_UNIT})"))


def _series(rows: pl.DataFrame, metric: str) -> pl.DataFrame:
    return rows.filter(pl.col("metric") == metric).sort("tokens")


def _traces(run: dict, rows: pl.DataFrame, colour: str, name: str, metric: str) -> list[dict]:
    out = []
    for r, (series, _) in enumerate(ROWS, start=1):
        part = _series(rows, series)
        if part.is_empty():
            continue
        out.append(
            {
                "type": "scatter",
                "x": part["tokens"].to_list(),
                "y": part["value"].to_list(),
                "mode": "lines",
                "name": name,
                "legendgroup": run["run_id"],
                "showlegend": not out,
                "line": {"color": colour, "width": 3 if colour == TRUNK_COLOUR else 2},
                "xaxis": "x" if r == 1 else f"x{r}",
                "yaxis": "y" if r == 1 else f"y{r}",
                "hovertemplate": f"{name}<br>%{{x:.3s}} tokens<br>%{{y:.4g}}<extra></extra>",
            }
        )
    if run.get(metric) is not None:
        out.append(
            {
                "type": "scatter",
                "x": [run["tokens"]],
                "y": [run[metric]],
                "mode": "markers",
                "name": f"{name}: {theme.METRIC_LABELS.get(metric, metric)}",
                "legendgroup": run["run_id"],
                "showlegend": False,
                "marker": {"color": colour, "size": 10, "symbol": "diamond"},
                "xaxis": "x2",
                "yaxis": "y2",
                "hovertemplate": f"{name}<br>final %{{y:.4f}}<extra></extra>",
            }
        )
    return out


def _from_fork(trunk: pl.DataFrame, branch: pl.DataFrame) -> pl.DataFrame:
    """The branch's rows preceded by the trunk's last row of each metric before the fork, so the
    branch line starts where it leaves the trunk."""
    first = branch["tokens"].min()
    before = trunk.filter(pl.col("tokens") < first).sort("tokens").group_by("metric").last()
    return pl.concat([before.select(branch.columns), branch])


def wsd_branches_panel(
    runs: pl.DataFrame, curves: pl.DataFrame, metric: str = "final_val_ood_loss"
) -> Panel:
    """LR (top) and train loss (bottom) vs tokens of a WSD trunk and each branch forked from it."""
    require_columns(runs, ("trunk_run_id", "fork_step"), "the run table")
    branches = runs.filter(pl.col("trunk_run_id").is_not_null())
    trunks = runs.filter(pl.col("run_id").is_in(branches["trunk_run_id"].implode()))
    if trunks.is_empty():
        raise K3ScaleError("dashboard: no WSD branch runs (trunk_run_id) with their trunk")
    wanted = curves.filter(pl.col("metric").is_in([m for m, _ in ROWS]))
    by_run = {key[0]: part for key, part in wanted.group_by("run_id")}
    palette = plotly.colors.qualitative.D3
    traces, owner, titles = [], [], []
    for trunk in trunks.sort("n_active", "lr", "batch_size").iter_rows(named=True):
        if trunk["run_id"] not in by_run:
            continue
        mine = branches.filter(pl.col("trunk_run_id") == trunk["run_id"]).sort("tokens")
        new = _traces(
            trunk,
            by_run[trunk["run_id"]],
            TRUNK_COLOUR,
            f"trunk to D={theme.fmt_sci(trunk['tokens'])}",
            metric,
        )
        for i, branch in enumerate(mine.iter_rows(named=True)):
            if branch["run_id"] in by_run:
                name = f"branch to D={theme.fmt_sci(branch['tokens'])}"
                rows = _from_fork(by_run[trunk["run_id"]], by_run[branch["run_id"]])
                new += _traces(branch, rows, palette[i % len(palette)], name, metric)
        traces += new
        owner += [len(titles)] * len(new)
        titles.append(f"WSD trunk and branches, {trunk['size']} {run_label(trunk)}")
    if not titles:
        raise K3ScaleError("dashboard: no WSD trunk has curves in the curve table")
    for trace, i in zip(traces, owner):
        trace["visible"] = i == 0
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.4, 0.6]
    )
    fig.add_traces(traces)
    fig.update_xaxes(title_text=theme.TOKENS_TITLE, row=2)
    # A linear token axis reads better as 50k, 100k than as 0.5×10^5.
    fig.update_xaxes(exponentformat="SI")
    for r, (_, title) in enumerate(ROWS, start=1):
        fig.update_yaxes(title_text=title, row=r)
    fig.update_layout(
        updatemenus=[
            {
                "buttons": [
                    {
                        "label": title.removeprefix("WSD trunk and branches, "),
                        "method": "update",
                        "args": [{"visible": [o == i for o in owner]}, {"title.text": title}],
                    }
                    for i, title in enumerate(titles)
                ],
                "direction": "down",
                "x": 1.0,
                "xanchor": "right",
                "y": 1.15,
                "yanchor": "top",
            }
        ]
    )
    theme.base_layout(fig, titles[0], height=560)
    fig.update_layout(margin={"t": 90})
    caption = (
        f"Each of {len(titles)} WSD trunks (pick it in the menu; dark line) with the "
        f"{branches.height} branches forked from the trunks in all: peak-LR schedule (top) and "
        "train loss (bottom, lines) vs tokens; a branch decays from its fork to its own budget; "
        f"diamonds: {theme.METRIC_LABELS.get(metric, metric)} of each run."
    )
    return Panel(key="wsd-branches", figure=fig, caption=caption)
