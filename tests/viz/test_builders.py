"""Every figure builder on the committed fixture: data drawn, headline numbers in the captions.

Expected numbers are recomputed here from the run table, or read from the fit artifact the
project's recipes make of the fixture tables (conftest.py), not read back from the builders.
"""

from __future__ import annotations

import copy
import math
import re
import statistics
from dataclasses import replace

import numpy as np
import plotly.colors
import polars as pl
import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.values.text import ratio_text, reason_text, verdict_text
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.scaling.values.verdict import Verdict
from k3scale.viz import curves as curves_mod
from k3scale.viz import frontier, hp, landscape, overview, surface, theme
from k3scale.viz.fits import DashboardFits
from k3scale.viz.summaries import best_trials, representative_cells, status_counts

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


def test_a_wsd_branch_spends_only_the_compute_after_its_fork():
    # A trunk of 1000 tokens and a branch forked at step 60 of batch 10 tokens (600 tokens in),
    # ending at 800: the branch spent 200 tokens' compute, not 800.
    base = {"arch": "k3", "schedule": "wsd", "size": "s1", "status": "finished", "n_active": 10}
    runs = pl.DataFrame(
        [
            {**base, "run_id": "t", "cell": "a", "budget_tokens": 1000, "tokens": 1000},
            {
                **base,
                "run_id": "b",
                "cell": "b",
                "budget_tokens": 800,
                "tokens": 800,
                "trunk_run_id": "t",
                "fork_step": 60,
            },
        ]
    ).with_columns(
        arm=pl.lit("tuned"),
        lr=pl.lit(0.01),
        batch_size=pl.lit(1),
        batch_tokens=pl.lit(10),
        c_6n=6.0 * 10 * pl.col("tokens"),
        c_attn=7.0 * 10 * pl.col("tokens"),
    )
    spent = dict(status_counts(runs).select("cell", "compute").rows())
    assert spent == {"a": 6.0 * 10 * 1000, "b": 6.0 * 10 * 200}


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


def test_curves_caption_says_when_validation_ran_only_a_few_times(runs, curves):
    """Two val points per run draw as two dots: the caption says why (issue 37)."""
    val = pl.col("metric").is_in(["val/id_loss", "val/ood_loss"])
    last_two = (
        curves.filter(val).sort("tokens").group_by("run_id", "metric", maintain_order=True).tail(2)
    )
    sparse = pl.concat([curves.filter(~val), last_two.select(curves.columns)])
    caption = curves_mod.training_curves_panel(runs, sparse, METRIC).caption
    assert "Validation ran twice per run at most" in caption
    full = curves.filter(pl.col("metric") == "val/ood_loss").group_by("run_id").len()
    if full["len"].max() > 3:
        assert "Validation ran" not in curves_mod.training_curves_panel(runs, curves).caption


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
    assert f"{edges} of 9 optima sit at the edge" in panel.caption
    stars = [t for t in panel.figure.data if t.marker.symbol in ("star", "star-open")]
    assert len(stars) == 9
    assert sum(s.marker.symbol == "star-open" for s in stars) == edges
    # The optimum's colour is on no part of the loss colour scale (where yellow means worst).
    assert {s.marker.color for s in stars} == {landscape.OPTIMUM_COLOUR}
    viridis = {c.lower() for c in plotly.colors.sequential.Viridis}
    assert landscape.OPTIMUM_COLOUR.lower() not in viridis
    best_lrs = sorted(best_tuned(runs, c)["lr"] for c in tuned["cell"].unique())
    assert sorted(s.x[0] for s in stars) == best_lrs
    assert panel.figure.layout.xaxis.type == "log"


def _landscape_runs(budgets: dict[str, tuple[int, ...]], batches: tuple[int, ...]) -> pl.DataFrame:
    """Tuned trials of one (arch, schedule): each size at its own budgets, 3 LRs per batch."""
    rows = []
    for size, sizes_budgets in budgets.items():
        for budget in sizes_budgets:
            for lr in (1e-3, 3e-3, 1e-2):
                for batch in batches:
                    gap = 0.02 * abs(math.log(lr / 3e-3)) + 0.001 * batch
                    rows.append(
                        {
                            "run_id": f"{size}-{budget}-{lr}-{batch}",
                            "status": "finished",
                            "arm": "tuned",
                            "cell": f"{size}|D{budget}|wsd",
                            "arch": "k3",
                            "schedule": "wsd",
                            "size": size,
                            "budget_tokens": budget,
                            "n_active": 10 if size == "k3-s1" else 20,
                            "tokens": budget,
                            "batch_tokens": batch * 256,
                            "c_6n": 60.0 * budget,
                            "c_attn": 70.0 * budget,
                            "lr": lr,
                            "batch_size": batch,
                            METRIC: 4.0 + gap,
                        }
                    )
    return pl.DataFrame(rows)


def test_landscape_columns_follow_each_sizes_budgets_and_the_colours_its_gaps():
    """Tokens-per-parameter designs give each size its own budgets: one column per budget rank,
    not per distinct budget (issue 37: 12 of 18 panels were empty)."""
    runs = _landscape_runs({"k3-s1": (100, 200), "k3-s2": (300, 600)}, batches=(4, 8))
    panel = landscape.lr_batch_landscape_panel(runs, "k3", "wsd", METRIC)
    titles = [a.text for a in panel.figure.layout.annotations]
    assert len(titles) == 4 and all(titles)  # 2 sizes x 2 budgets, no empty panel
    best = runs.group_by("cell").agg(pl.col(METRIC).min().alias("best"))
    gaps = runs.join(best, on="cell").select(pl.col(METRIC) - pl.col("best"))[METRIC]
    top = panel.figure.layout.coloraxis.cmax
    assert top == pytest.approx(gaps.quantile(0.95)) and top < landscape.MAX_GAP
    assert f"tops out at {top:.3f}" in panel.caption


def test_landscape_of_one_batch_size_defers_to_the_lr_sweep():
    runs = _landscape_runs({"k3-s1": (100,)}, batches=(7,))
    with pytest.raises(K3ScaleError, match=r"one batch size \(7\) was tried"):
        landscape.lr_batch_landscape_panel(runs, "k3", "wsd", METRIC)


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
    opt = best_trials(pl.DataFrame(rows), METRIC).row(0, named=True)
    assert (opt["run_id"], opt["lr_edge"], opt["batch_edge"]) == ("b", None, "high")
    rows[2][METRIC] = 2.0
    opt = best_trials(pl.DataFrame(rows), METRIC).row(0, named=True)
    # The diverged trial at 3e-2 brackets the optimum at 1e-2 from above.
    assert (opt["run_id"], opt["lr_edge"], opt["batch_edge"]) == ("c", None, "low")
    rows[3] = {**rows[3], "status": "finished", METRIC: 1.0}
    assert best_trials(pl.DataFrame(rows), METRIC)["lr_edge"][0] == "high"


def test_hp_panel_draws_the_fitted_optima_and_the_stored_laws(wsd_fits, artifacts):
    panel = hp.hp_optima_panel(wsd_fits, "c_6n")
    results = artifacts["cosine_vs_wsd"]["results"]
    optima = results["cell_optima"]
    points = [t for t in panel.figure.data if t.mode == "markers"]
    for trace in points:
        target = "lr_opt" if trace.xaxis == "x" else "batch_opt"
        for x, y, symbol in zip(trace.x, trace.y, trace.marker.symbol):
            (entry,) = [
                o
                for o in optima
                if o["c_6n"] == x
                and f"{o['cell']['arch']} {o['cell']['schedule']}" in trace.name
                and o["optimum"]["params"][target] == y
            ]
            assert symbol.endswith("-open") == (not Verdict.from_json(entry["verdict"]).identified)
    assert sum(len(t.x) for t in points) == 2 * len(optima)
    assert {s.endswith("-open") for t in points for s in t.marker.symbol} == {True, False}
    lines = [t for t in panel.figure.data if t.mode == "lines"]
    assert lines
    for line in lines:
        schedule = line.name.split()[0]
        target = "lr_opt" if line.xaxis == "x" else "batch_opt"
        params = results["per_schedule"][schedule]["hp_laws"]["c_6n"][target]["C"]["params"]
        # The stored law y = k C^exp_C, evaluated where drawn: never a refit.
        expected = params["k"] * np.asarray(line.x) ** params["exp_C"]
        np.testing.assert_allclose(line.y, expected, rtol=1e-12)
        if target == "lr_opt":
            assert f"{schedule} lr_opt ∝ C^{params['exp_C']:.3f}" in panel.caption
    # The report's lr_opt ratio of the cells whose comparison it identifies.
    ratios = [
        c["comparison"]["wsd"]["lr_ratio"]
        for c in results["schedule_comparison"]["cells"]
        if Verdict.from_json(c["comparison"]["wsd"]["verdict_own"]).identified
    ]
    assert ratios
    assert f"median lr_opt wsd/cosine = {statistics.median(ratios):.2f}" in panel.caption
    assert f"over the {len(ratios)} cells" in panel.caption
    assert all(panel.figure.layout[f"yaxis{i}"].type == "log" for i in ("", "2"))
    with pytest.raises(K3ScaleError, match=r"no fit file given"):
        hp.hp_optima_panel(DashboardFits())


def test_hp_panel_leaves_out_a_batch_the_design_fixed(wsd_fits):
    """A grid design fixes the batch: one LR panel, and the caption says the batch is fixed
    (a panel of one constant read as a finding; issue 37)."""
    fixed = replace(
        wsd_fits, cell_optima=tuple(replace(o, batch_opt=1792.0) for o in wsd_fits.cell_optima)
    )
    panel = hp.hp_optima_panel(fixed, "c_6n")
    assert {t.xaxis for t in panel.figure.data} == {"x"}
    assert panel.figure.layout.title.text.startswith("Fitted optimum peak LR vs compute")
    assert "the batch is fixed by the design at 1,792 tokens per step" in panel.caption
    assert "(peak LR, batch)" not in panel.caption
    two = hp.hp_optima_panel(wsd_fits, "c_6n")
    assert {t.xaxis for t in two.figure.data} == {"x", "x2"}


def test_frontier_panel_draws_the_stored_curves_and_fitted_optima(runs, fits, fit_document):
    panel = frontier.frontier_panel(runs, fits, METRIC, "c_6n")
    stored = fit_document["results"]["compute_optimal"]["c_6n"]["routes"]
    for route, part in stored.items():
        for arm, entry in part["arms"].items():
            # A surface or frontier law its checks refuse is drawn thin and dotted, no band; the
            # monotone route has no form to refuse.
            fitted = entry.get("surface") or entry.get("law")
            solid = fitted is None or Verdict.from_json(fitted["verdict"]).identified
            name = f"{arm} L*(C), {route} route" + ("" if solid else " (refused)")
            line = next(t for t in panel.figure.data if t.name == name)
            assert list(line.x) == entry["curve"]["compute"]
            assert list(line.y) == entry["curve"]["loss"]
            styles = {
                "surface": "solid",
                "envelope": "dash",
                "envelope_e0": "dashdot",
                "monotone": "longdash",
            }
            assert line.line.dash == (styles[route] if solid else theme.UNIDENTIFIED_DASH)
            # Refused routes share the dotted line: the route's open marker tells them apart.
            if not solid:
                assert line.marker.symbol == theme.ROUTE_SYMBOL[route] + "-open"
            bands = [t for t in panel.figure.data if t.fill == "toself" and t.legendgroup == name]
            assert bool(bands) == solid
    assert sum(t.fill == "toself" for t in panel.figure.data) >= 2
    optima = fit_document["results"]["cell_optima"]
    filled = [t for t in panel.figure.data if t.name.endswith("cell optima")]
    hollow = [t for t in panel.figure.data if t.name.endswith("cell optima, not identified")]
    identified = [o for o in optima if Verdict.from_json(o["verdict"]).identified]
    assert sum(len(t.y) for t in filled) == len(identified)
    assert sum(len(t.y) for t in hollow) == len(optima) - len(identified) > 0
    for trace in filled:
        for x, y, up in zip(trace.x, trace.y, trace.error_y.array):
            entry = next(o for o in identified if (o["c_6n"], o["loss"]) == (x, y))
            assert y + up == pytest.approx(entry["loss_ci"][1], rel=1e-12)
    assert all(t.error_y.visible is False for t in hollow)
    assert all(t.marker.symbol.endswith("-open") for t in hollow)
    assert f"({len(identified)} of {len(optima)} identified" in panel.caption
    assert "band: 95%" in panel.caption and "bars: 95%" in panel.caption
    assert panel.figure.layout.xaxis.type == panel.figure.layout.yaxis.type == "log"
    assert "FLOPs" in panel.figure.layout.xaxis.title.text
    assert "nats/token" in panel.figure.layout.yaxis.title.text


UNIDENTIFIED = "not identified: alpha interval [0.05, 0.125] leaves (0.05, 2.0)"
# How the figures word it: as the report does.
UNIDENTIFIED_TEXT = "not identified (alpha interval [0.05, 0.125] leaves (0.05, 2.0))"


def _with_surface_verdict(doc: dict, arm: str, ruling: str) -> dict:
    doc = copy.deepcopy(doc)
    for result in doc["results"]["compute_optimal"].values():
        result["routes"]["surface"]["arms"][arm]["surface"]["verdict"] = ruling
    return doc


def test_an_unidentified_surface_is_drawn_apart_and_named(runs, fit_document):
    fits = DashboardFits.from_artifact(_with_surface_verdict(fit_document, "k2", UNIDENTIFIED))
    panel = frontier.frontier_panel(runs, fits, METRIC, "c_6n")
    (line,) = [t for t in panel.figure.data if (t.name or "").startswith("k2 L*(C), surface")]
    assert line.name == "k2 L*(C), surface route (refused)" and line.line.dash == "dot"
    bands = [t for t in panel.figure.data if t.fill == "toself"]
    assert all(not t.legendgroup.startswith("k2 L*(C), surface") for t in bands)
    assert f"k2 surface route dotted, refused: {UNIDENTIFIED.split(': ', 1)[1]}" in panel.caption
    chinchilla = surface.surface_panel(fits, "k2", "cosine")
    assert UNIDENTIFIED_TEXT in chinchilla.figure.layout.title.text
    lines = [t for t in chinchilla.figure.data if t.type == "scatter" and t.mode == "lines"]
    assert lines and all(t.line.dash == "dot" for t in lines)


def test_without_a_fit_the_frontier_draws_runs_only(runs):
    panel = frontier.frontier_panel(runs, DashboardFits(), METRIC, "c_6n")
    assert all(t.name.endswith("all runs") for t in panel.figure.data)
    assert "no fit file" in panel.caption


def test_an_identified_surface_is_drawn_solid_with_its_band(runs, fit_document):
    doc = copy.deepcopy(fit_document)
    arms = doc["results"]["compute_optimal"]["c_6n"]["routes"]["surface"]["arms"]
    for entry in arms.values():
        entry["surface"]["verdict"] = "identified"
    fits = DashboardFits.from_artifact(doc, source="edited fixture")
    panel = frontier.frontier_panel(runs, fits, METRIC, "c_6n")
    for arm in arms:
        line = next(t for t in panel.figure.data if t.name == f"{arm} L*(C), surface route")
        assert line.line.dash == "solid"
        assert any(t.fill == "toself" and t.legendgroup == line.name for t in panel.figure.data)


def test_multiplier_caption_states_the_reports_values(fits, fit_document):
    panel = frontier.multiplier_panel(fits, "c_6n", "k3")
    stored = fit_document["results"]["compute_optimal"]["c_6n"]
    identifying = []
    for route, part in stored["routes"].items():
        entries = part["multiplier"]["k3"]
        found = [i for i, e in enumerate(entries) if Verdict.from_json(e["verdict"]).identified]
        if found:
            identifying.append(route)
            printed = ratio_text(Estimate.from_json(entries[found[-1]]))
            at = theme.fmt_sci(stored["compute"][found[-1]])
            assert f"{route} route M = {printed} at C = {at} FLOPs" in panel.caption
        else:
            assert f"{route} route: identified at none of " in panel.caption
        for entry in entries:
            ruling = Verdict.from_json(entry["verdict"])
            if not ruling.identified:
                assert reason_text(ruling) in panel.caption
    # The fixture's laws and surfaces are refused; the monotone route, with no form to refuse,
    # identifies M(C) over the overlap.
    assert "monotone" in identifying, "the fixture's monotone route identifies M(C)"
    assert "M > 1 means k3 needs less compute" in panel.note
    assert drawn_points(panel.figure) > 0


def test_a_multiplier_with_no_value_is_listed_not_drawn(fit_document):
    from k3scale.viz.dashboard import PanelList

    doc = copy.deepcopy(fit_document)
    ruling = "not identified: M(C) interval spans 60.0 decades (> 1)"
    for part in doc["results"]["compute_optimal"]["c_6n"]["routes"].values():
        for entry in part["multiplier"]["k3"]:
            entry.update(value=None, verdict=ruling)
    page = PanelList()
    page.add(frontier.multiplier_panel, DashboardFits.from_artifact(doc), "c_6n", "k3")
    assert not page.panels
    (line,) = page.skipped
    assert "not drawn" in line and "60.0 decades" in line


def test_surface_panel_draws_the_reports_surface(fits, fit_document):
    panel = surface.surface_panel(fits, "k3", "cosine")
    stored = fit_document["results"]["compute_optimal"]["c_6n"]["routes"]["surface"]["arms"]
    params, ci = stored["k3"]["surface"]["params"], stored["k3"]["surface"]["ci"]
    alpha = f"α={params['alpha']:.3f} {theme.fmt_interval(*ci['alpha'])}"
    beta = f"β={params['beta']:.3f} {theme.fmt_interval(*ci['beta'])}"
    assert f"{alpha}, {beta}" in panel.caption
    ruling = Verdict.from_json(stored["k3"]["surface"]["verdict"])
    assert f"(surface {verdict_text(ruling)})" in panel.figure.layout.title.text
    contour = next(t for t in panel.figure.data if t.type == "contour")
    n, d = 10 ** np.asarray(contour.x), 10 ** np.asarray(contour.y)
    expected = (
        params["E"]
        + params["A"] * n[None, :] ** -params["alpha"]
        + params["B"] * d[:, None] ** -params["beta"]
    )
    np.testing.assert_allclose(np.asarray(contour.z), expected, rtol=1e-12)
    optima = fits.optima(arch="k3", schedule="cosine")
    points = [t for t in panel.figure.data if t.type == "scatter" and t.name.startswith("D = ")]
    points = [t for t in points if t.mode == "markers"]
    assert sorted(y for t in points for y in t.y) == sorted(o.loss.value for o in optima)


def test_surface_panel_without_a_surface_says_why(fits):
    one_size = replace(
        fits, cell_optima=tuple(o for o in fits.cell_optima if o.cell["size"].endswith("t1"))
    )
    with pytest.raises(K3ScaleError, match="several sizes per budget"):
        surface.surface_panel(one_size, "k3", "cosine")
    panel = surface.surface_panel(replace(fits, comparisons={}), "k3", "cosine")
    assert not any(t.type == "contour" for t in panel.figure.data)
    assert "no surface drawn: the fit file has no compute-optimal section" in panel.caption
    with pytest.raises(K3ScaleError, match="no fit file given"):
        surface.surface_panel(DashboardFits(), "k3", "cosine")


def test_builders_name_missing_columns(runs):
    with pytest.raises(K3ScaleError, match="c_6n"):
        overview.overview_panel(runs.drop("c_6n"))
