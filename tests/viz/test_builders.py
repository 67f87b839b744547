"""Every figure builder on the committed fixture: data drawn, headline numbers in the captions.

Expected numbers are recomputed here from the run table or the fit JSON (and, for fitted
curves, with k3scale/scaling's own formulas), not read back from the builders.
"""

from __future__ import annotations

import math
import re
import statistics

import numpy as np
import plotly.colors
import polars as pl
import pytest
from scipy import stats

from k3scale.errors import K3ScaleError
from k3scale.scaling.frontier import predict_frontier
from k3scale.scaling.multiplier import multiplier_at
from k3scale.viz import curves as curves_mod
from k3scale.viz import frontier, hp, landscape, overview, schedules, surface
from k3scale.viz.summaries import (
    cell_optima,
    difference_interval,
    mean_interval,
    representative_cells,
)

METRIC = "final_val_ood_loss"


def drawn_points(fig) -> int:
    """Finite data points over all traces (x/y or z)."""
    total = 0
    for trace in fig.data:
        values = getattr(trace, "z", None)
        if values is None:
            values = trace.y
        if values is None:
            continue
        arr = np.asarray(values, dtype=object).ravel()
        total += sum(1 for v in arr if v is not None and math.isfinite(float(v)))
    return total


def best_tuned(runs: pl.DataFrame, cell: str) -> dict:
    return (
        runs.filter(
            (pl.col("cell") == cell) & (pl.col("arm") == "tuned") & (pl.col("status") == "finished")
        )
        .sort(METRIC)
        .row(0, named=True)
    )


def test_overview_counts_runs_by_status(runs):
    panel = overview.overview_panel(runs)
    counts = dict(runs.group_by("status").len().rows())
    for status in ("finished", "diverged", "failed"):
        assert f"{counts[status]} {status}" in panel.caption
        bar = next(t for t in panel.figure.data if t.name == status)
        assert sum(bar.y) == counts[status]
    assert f"{runs['cell'].n_unique()} cells, {runs.height} runs" in panel.caption
    assert drawn_points(panel.figure) > 0


def test_curves_menu_holds_every_cell_and_highlights_its_best_trial(runs, curves):
    panel = curves_mod.training_curves_panel(runs, curves, METRIC)
    fig = panel.figure
    (menu,) = fig.layout.updatemenus
    assert len(menu.buttons) == runs["cell"].n_unique()
    cell = "k3-t3|D262144|cosine"
    best = best_tuned(runs, cell)
    i = next(i for i, b in enumerate(menu.buttons) if b.label == "k3-t3, D=2.6e5, cosine")
    visible = [t for t, v in zip(fig.data, menu.buttons[i].args[0]["visible"]) if v]
    assert len({t.legendgroup for t in visible}) == runs.filter(pl.col("cell") == cell).height
    bold = [t for t in visible if t.line.width == 3.5]
    assert len(bold) == 3 and all("(best)" in t.name for t in bold)
    assert bold[0].name == f"lr={best['lr']:.3g} b={best['batch_size']} s0 (best)"
    ood = curves.filter((pl.col("run_id") == best["run_id"]) & (pl.col("metric") == "val/ood_loss"))
    assert list(bold[2].y) == ood.sort("tokens")["value"].to_list()
    # Legends name settings, never run ids.
    assert not any(re.search(r"r\d{5}|[0-9a-f]{32}", t.name) for t in fig.data)
    assert sum(t.visible for t in fig.data) < len(fig.data)
    assert fig.layout.xaxis.type == "log"
    assert "tokens" in fig.layout.xaxis.title.text


def test_representative_cells_are_the_largest_of_each_group(runs):
    cells = representative_cells(runs)
    assert cells == [
        "k2-t3|D262144|cosine",
        "k2-t3|D262144|wsd",
        "k3-t3|D262144|cosine",
        "k3-t3|D262144|wsd",
    ]


def test_landscape_marks_optimum_and_edge_optima(runs):
    panel = landscape.lr_batch_landscape_panel(runs, "k2", "wsd", METRIC)
    tuned = runs.filter(
        (pl.col("arch") == "k2") & (pl.col("schedule") == "wsd") & (pl.col("arm") == "tuned")
    )
    edges = 0
    for cell in tuned["cell"].unique().to_list():
        part = tuned.filter(pl.col("cell") == cell)
        best = best_tuned(runs, cell)
        lr_edge = best["lr"] in (part["lr"].min(), part["lr"].max())
        batch_edge = best["batch_size"] in (part["batch_size"].min(), part["batch_size"].max())
        edges += lr_edge or batch_edge
    assert f"{edges} of 6 optima sit at the edge" in panel.caption
    stars = [t for t in panel.figure.data if t.marker.symbol in ("star", "star-open")]
    assert len(stars) == 6
    assert sum(s.marker.symbol == "star-open" for s in stars) == edges
    # The optimum's colour is on no part of the loss colour scale (where yellow means worst).
    assert {s.marker.color for s in stars} == {landscape.OPTIMUM_COLOUR}
    viridis = {c.lower() for c in plotly.colors.sequential.Viridis}
    assert landscape.OPTIMUM_COLOUR.lower() not in viridis
    best_lrs = sorted(best_tuned(runs, c)["lr"] for c in tuned["cell"].unique())
    assert sorted(s.x[0] for s in stars) == best_lrs
    assert panel.figure.layout.xaxis.type == "log"


def test_cell_optima_flags_edges_on_a_hand_made_cell():
    base = {
        "status": "finished",
        "arm": "tuned",
        "cell": "c",
        "arch": "k3",
        "schedule": "cosine",
        "size": "k3-t1",
        "budget_tokens": 10,
        "batch_tokens": 1,
        "n_active": 5,
        "tokens": 10,
        "c_6n": 300.0,
        "c_attn": 400.0,
    }
    rows = [
        {**base, "run_id": "a", "lr": 1e-3, "batch_size": 8, METRIC: 3.0},
        {**base, "run_id": "b", "lr": 3e-3, "batch_size": 16, METRIC: 2.5},
        {**base, "run_id": "c", "lr": 1e-2, "batch_size": 8, METRIC: 2.9},
        {**base, "run_id": "d", "lr": 3e-2, "batch_size": 8, METRIC: None, "status": "diverged"},
    ]
    opt = cell_optima(pl.DataFrame(rows), METRIC).row(0, named=True)
    assert (opt["run_id"], opt["lr_edge"], opt["batch_edge"]) == ("b", None, "high")
    rows[2][METRIC] = 2.0
    opt = cell_optima(pl.DataFrame(rows), METRIC).row(0, named=True)
    # The diverged trial at 3e-2 brackets the optimum at 1e-2 from above.
    assert (opt["run_id"], opt["lr_edge"], opt["batch_edge"]) == ("c", None, "low")
    rows[3] = {**rows[3], "status": "finished", METRIC: 1.0}
    assert cell_optima(pl.DataFrame(rows), METRIC)["lr_edge"][0] == "high"


def test_hp_panel_draws_laws_and_reports_the_lr_ratio(runs, fits):
    panel = hp.hp_optima_panel(runs, fits, METRIC, "c_6n")
    best = {c: best_tuned(runs, c) for c in runs["cell"].unique()}
    ratios = []
    for cell, row in best.items():
        if row["schedule"] == "wsd":
            ratios.append(row["lr"] / best[cell.replace("|wsd", "|cosine")]["lr"])
    assert f"median lr*_WSD/lr*_cosine = {statistics.median(ratios):.2f}" in panel.caption
    assert f"over {len(ratios)} cells" in panel.caption
    for law in (law for law in fits.hp_laws if law.target == "lr"):
        assert f"{law.arch} {law.schedule} lr* ∝ C^{law.exponent:.3f}" in panel.caption
    fills = [t for t in panel.figure.data if t.fill == "toself"]
    assert len(fills) == len(fits.hp_laws) == 8
    assert all(panel.figure.layout[f"yaxis{i}"].type == "log" for i in ("", "2"))


def test_frontier_panel_draws_each_fit_with_its_band(runs, fits, fit_document):
    panel = frontier.frontier_panel(runs, fits, METRIC, "c_6n")
    comparisons = [c for c in fit_document["frontier_comparisons"] if c["compute"] == "c_6n"]
    for comp in comparisons:
        for arch, group in comp["result"]["groups"].items():
            assert f"{arch} {comp['fixed']} α={group['alpha']:.3f}" in panel.caption
            line = next(
                t
                for t in panel.figure.data
                if t.name == f"{arch} {comp['fixed']} fit α={group['alpha']:.3f}"
            )
            expected = predict_frontier(group, np.asarray(line.x))
            np.testing.assert_allclose(line.y, expected, rtol=1e-12)
    assert sum(t.fill == "toself" for t in panel.figure.data) == 4
    assert panel.figure.layout.xaxis.type == panel.figure.layout.yaxis.type == "log"
    assert "FLOPs" in panel.figure.layout.xaxis.title.text
    assert "nats/token" in panel.figure.layout.yaxis.title.text


def test_multiplier_caption_states_m_at_the_largest_compute_and_shared_k(fits, fit_document):
    fit = next(m for m in fits.multipliers if m.fixed == "cosine" and m.compute == "c_6n")
    panel = frontier.multiplier_panel(fit)
    comp = next(
        c
        for c in fit_document["frontier_comparisons"]
        if c["fixed"] == "cosine" and c["compute"] == "c_6n"
    )
    groups = comp["result"]["groups"]
    # Value, interval and compute of one entry: the largest compute inside the data.
    top = comp["result"]["data_compute_range"][1]
    entry = max(
        (m for m in comp["result"]["multiplier"] if m["compute"] <= top * (1 + 1e-9)),
        key=lambda m: m["compute"],
    )
    expected = multiplier_at(groups["k2"], groups["k3"], [entry["compute"]])[0]
    shown = re.search(r"M = ([0-9.]+) \[([0-9.]+), ([0-9.]+)\] at C = (\S+) FLOPs", panel.caption)
    assert float(shown.group(1)) == pytest.approx(expected, rel=0.02)
    assert [float(shown.group(i)) for i in (2, 3)] == pytest.approx(entry["ci"], rel=0.01)
    assert float(shown.group(4)) == pytest.approx(entry["compute"], rel=0.01)
    assert max(panel.figure.data[0].x) <= top * (1 + 1e-9)
    assert "M > 1 means k3 needs less compute" in panel.note
    shared = comp["result"]["shared_exponent"]
    assert f"shared-exponent k = {shared['multiplier']:.2f}" in panel.caption
    assert "accepted" in panel.caption
    assert drawn_points(panel.figure) > 0


def test_schedule_comparison_counts_cells_where_cosine_wins(runs):
    panel = schedules.schedule_comparison_panel(runs, "k3", METRIC)
    wins, cells = 0, 0
    k3 = runs.filter(pl.col("arch") == "k3")
    for cell in k3.filter(pl.col("schedule") == "cosine")["cell"].unique().to_list():
        means = {}
        for sched in ("cosine", "wsd"):
            c = cell.replace("|cosine", f"|{sched}")
            best = best_tuned(runs, c)
            seeds = k3.filter(
                (pl.col("cell") == c)
                & (pl.col("arm") == "seed")
                & (pl.col("lr") == best["lr"])
                & (pl.col("batch_size") == best["batch_size"])
            )[METRIC].to_list()
            means[sched] = statistics.mean([best[METRIC], *seeds])
        wins += means["wsd"] > means["cosine"]
        cells += 1
    assert f"cosine lower in {wins}/{cells} cells" in panel.caption
    assert panel.num_traces == 6
    with pytest.raises(K3ScaleError, match="cosine and WSD"):
        schedules.schedule_comparison_panel(runs.filter(pl.col("schedule") == "wsd"), "k3")


def test_surface_panel_contours_the_fit_and_needs_several_sizes(runs, fits):
    panel = surface.surface_panel(runs, fits, "k3", "cosine", METRIC)
    fit = fits.surface("k3", "cosine")
    assert f"α={fit.params['alpha']:.3f}, β={fit.params['beta']:.3f}" in panel.caption
    contour = next(t for t in panel.figure.data if t.type == "contour")
    assert np.isfinite(np.asarray(contour.z)).all()
    one_size = runs.filter(pl.col("size").str.ends_with("t1"))
    with pytest.raises(K3ScaleError, match="several sizes per budget"):
        surface.surface_panel(one_size, fits, "k3", "cosine", METRIC)


def test_builders_name_missing_columns(runs):
    with pytest.raises(K3ScaleError, match="c_6n"):
        overview.overview_panel(runs.drop("c_6n"))


def test_mean_interval_matches_scipy():
    values = [4.1, 4.15, 4.08, 4.2]
    mean, lo, hi = mean_interval(values)
    ref = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert (lo, hi) == pytest.approx(ref, rel=1e-12)
    assert mean == pytest.approx(np.mean(values))
    assert all(math.isnan(v) for v in mean_interval([4.0])[1:])


def test_difference_interval_is_welch():
    a, b = [4.3, 4.35, 4.28], [4.1, 4.2, 4.15, 4.12]
    diff, lo, hi = difference_interval(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(np.mean(a) - np.mean(b))
    assert (lo, hi) == pytest.approx((ref.low, ref.high), rel=1e-10)
