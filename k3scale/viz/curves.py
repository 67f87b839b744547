"""Training and validation (ID, OOD) loss curves of every run, one cell at a time (a menu).

Legends name a run by what a researcher set (peak LR, batch, seed, arm), never by its run id.
A WSD branch's curve starts at its fork, so it is drawn with its trunk's curve up to there.
"""

from __future__ import annotations

import plotly.colors
import polars as pl
from plotly.subplots import make_subplots

from k3scale.errors import K3ScaleError
from k3scale.viz import theme
from k3scale.viz.panel import Panel
from k3scale.viz.summaries import TUNED, best_trials, cell_label, require_columns

CURVE_METRICS = ("train/loss", "val/id_loss", "val/ood_loss")
BEST_COLOUR = "#000000"


def run_label(row: dict) -> str:
    """'lr=0.0104 b=16 s0' (+ the arm when not a tuning trial) for legends and hovers."""
    label = f"lr={row['lr']:.3g} b={row['batch_size']} s{row.get('seed') or 0}"
    arm = row.get("arm") or TUNED
    return label if arm == TUNED else f"{label} ({arm})"


def with_trunk(run_id: str, trunk_id: str | None, by_run: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """A run's curve rows; a branch's are preceded by its trunk's rows before the fork."""
    own = by_run.get(run_id)
    trunk = by_run.get(trunk_id) if trunk_id else None
    if own is None or trunk is None:
        return own
    first = own["tokens"].min()
    return pl.concat([trunk.filter(pl.col("tokens") < first), own])


def _run_traces(row: dict, rows: pl.DataFrame, colour: str, best: bool) -> list[dict]:
    """One trace per metric as plain dicts: plotly validates them once, in `add_traces`."""
    name = run_label(row) + (" (best)" if best else "")
    traces = []
    for col, metric in enumerate(CURVE_METRICS, start=1):
        part = rows.filter(pl.col("metric") == metric).sort("tokens")
        if part.is_empty():
            continue
        traces.append(
            {
                "type": "scatter",
                "x": part["tokens"].to_list(),
                "y": part["value"].to_list(),
                "mode": "lines+markers" if metric != "train/loss" else "lines",
                "name": name,
                "legendgroup": row["run_id"],
                "showlegend": not traces,
                "line": {
                    "color": BEST_COLOUR if best else colour,
                    "width": 3.5 if best else 1.2,
                    "dash": "solid" if row["status"] == "finished" else "dot",
                },
                "marker": {"size": 6},
                "opacity": 1.0 if best else 0.7,
                "xaxis": f"x{'' if col == 1 else col}",
                "yaxis": f"y{'' if col == 1 else col}",
                "hovertemplate": f"{name}<br>%{{x:.3s}} tokens<br>loss %{{y:.4f}}<extra></extra>",
            }
        )
    return traces


def _cell_order(runs: pl.DataFrame) -> list[dict]:
    return (
        runs.select("cell", "arch", "schedule", "size", "budget_tokens", "n_active")
        .unique("cell")
        .sort("arch", "schedule", "n_active", "budget_tokens")
        .to_dicts()
    )


def training_curves_panel(
    runs: pl.DataFrame, curves: pl.DataFrame, metric: str = "final_val_ood_loss"
) -> Panel:
    """Train, val-ID and val-OOD loss vs tokens of every run, with a menu to pick the cell.

    Args:
        runs: run table (INTERFACES.md section 9).
        curves: curve table (`run_id, step, tokens, metric, value`).
        metric: run-table column that ranks trials (the study objective); the best tuned trial
            of each cell is drawn bold.
    """
    require_columns(curves, ("run_id", "tokens", "metric", "value"), "the curve table")
    wanted = curves.filter(pl.col("metric").is_in(CURVE_METRICS))
    by_run = {key[0]: part for key, part in wanted.group_by("run_id")}
    if not by_run:
        raise K3ScaleError("dashboard: the curve table holds no train or validation loss")
    best = dict(best_trials(runs, metric).select("cell", "run_id").rows())
    trunks = dict(runs.select("run_id", "trunk_run_id").rows()) if "trunk_run_id" in runs else {}
    palette = plotly.colors.qualitative.Plotly
    traces, owner, cells = [], [], []
    for cell in _cell_order(runs):
        cell_runs = runs.filter(pl.col("cell") == cell["cell"]).sort("arm", "lr", "run_id")
        drawn = 0
        for i, row in enumerate(cell_runs.iter_rows(named=True)):
            rows = with_trunk(row["run_id"], trunks.get(row["run_id"]), by_run)
            if rows is None:
                continue
            is_best = row["run_id"] == best.get(cell["cell"])
            new = _run_traces(row, rows, palette[i % len(palette)], is_best)
            traces += new
            owner += [len(cells)] * len(new)
            drawn += 1
        if drawn:
            cells.append({**cell, "num_runs": drawn})
    if not cells:
        raise K3ScaleError("dashboard: no run of the run table has loss curves")
    shown = _default_cell(cells)
    for trace, i in zip(traces, owner):
        trace["visible"] = i == shown
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=[theme.loss_title(m) for m in CURVE_METRICS],
        horizontal_spacing=0.07,
        shared_xaxes="all",
    )
    fig.add_traces(traces)
    fig.update_xaxes(type="log", title_text=theme.TOKENS_TITLE)
    fig.update_yaxes(title_text=f"loss ({theme.LOSS_UNIT})", col=1)
    titles = [_title(c) for c in cells]
    fig.update_layout(
        updatemenus=[
            {
                "buttons": [
                    {
                        "label": title.removeprefix("Loss curves, "),
                        "method": "update",
                        "args": [{"visible": [o == i for o in owner]}, {"title.text": title}],
                    }
                    for i, title in enumerate(titles)
                ],
                "active": shown,
                "direction": "down",
                "x": 1.0,
                "xanchor": "right",
                "y": 1.2,
                "yanchor": "top",
            }
        ]
    )
    theme.base_layout(fig, titles[shown], height=480)
    fig.update_layout(margin={"t": 90})
    val_points = _val_points_per_run(wanted)
    return Panel(key="curves", figure=fig, caption=_caption(runs, cells, val_points))


def _default_cell(cells: list[dict]) -> int:
    """The largest (size, budget) cell of the first (arch, schedule): where tuning matters most."""
    first = [
        i
        for i, c in enumerate(cells)
        if (c["arch"], c["schedule"]) == (cells[0]["arch"], cells[0]["schedule"])
    ]
    return first[-1]


def _title(cell: dict) -> str:
    return f"Loss curves, {cell_label(cell['size'], cell['budget_tokens'])}, {cell['schedule']}"


def _val_points_per_run(curves: pl.DataFrame) -> int:
    """The most val-OOD points any run logged (a WSD branch's own, without its trunk's)."""
    counts = curves.filter(pl.col("metric") == "val/ood_loss").group_by("run_id").len()
    return int(counts["len"].max()) if counts.height else 0


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _caption(runs: pl.DataFrame, cells: list[dict], val_points: int) -> str:
    counts = dict(runs.group_by("status").len().rows())
    sparse = (
        f" Validation ran {_times(val_points)} per run at most (the preset's eval_points: each "
        "evaluation costs CPU time the design spent on runs instead), so the val panels hold "
        "that many points per curve."
        if 0 < val_points <= 3
        else ""
    )
    return (
        f"Train, val-ID and val-OOD loss vs tokens of the {sum(c['num_runs'] for c in cells)} "
        f"runs of {len(cells)} cells (pick the cell in the menu; legend: peak LR, batch in "
        "sequences, seed, and the arm when not a tuning trial); each cell's best tuned trial "
        f"bold black; {counts.get('diverged', 0)} diverged and {counts.get('failed', 0)} failed "
        "runs dotted; WSD branches include their trunk's curve up to the fork." + sparse
    )
