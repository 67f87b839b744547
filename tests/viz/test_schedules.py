"""The schedule comparison figure draws the report's comparison, and nothing it does not print."""

from __future__ import annotations

import copy

import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.values.text import reason_text
from k3scale.scaling.values.verdict import Verdict
from k3scale.viz import schedules
from k3scale.viz.dashboard import PanelList
from k3scale.viz.fits import DashboardFits
from k3scale.viz.summaries import cell_label

OWN = "cosine − wsd at each schedule's own optimum"
SHARED = "cosine − wsd at cosine's optimum"


def test_without_a_comparison_the_page_says_what_it_needs(fits):
    page = PanelList()
    page.add(schedules.schedule_comparison_panel, DashboardFits())
    page.add(schedules.schedule_comparison_panel, fits)
    assert not page.panels
    assert "needs `--fit`" in page.skipped[0]
    assert "(k2_vs_k3) holds no schedule comparison" in page.skipped[1]


def test_the_figure_draws_every_cell_reading_and_the_pooled_mean(wsd_fits):
    panel = schedules.schedule_comparison_panel(wsd_fits)
    comparison = wsd_fits.schedule_comparison
    names = [t.name for t in panel.figure.data]
    drawn = sum(len(t.x) for t in panel.figure.data if t.name.startswith((OWN, SHARED)))
    assert drawn == sum(e.value is not None for d in comparison.cells for e in (d.own, d.shared))
    pooled = comparison.pooled["wsd"]
    assert pooled.mean.identified, "the fixture's pooled mean should be identified"
    assert f"cosine − wsd pooled over {pooled.identified_cells} of {pooled.cells} cells" in names
    assert "bars: 95% intervals" in panel.caption
    assert "a negative value means cosine reaches the lower loss" in panel.note


def test_unidentified_readings_are_hollow_without_bars_and_say_why(artifacts):
    doc = copy.deepcopy(artifacts["cosine_vs_wsd"])
    ruling = "not identified: wsd optimum: fitted optimum at the largest LR searched"
    entry = doc["results"]["schedule_comparison"]["cells"][0]
    first = entry["comparison"]["wsd"]
    first.update(verdict_own=ruling, ci_own=None, verdict_shared=ruling, ci_shared=None)
    doc["results"]["schedule_comparison"]["pooled"]["wsd"] = {
        "cells": 9,
        "identified_cells": 2,
        "clusters": 1,
        "verdict": "not identified: identified differences in 1 independent cluster(s)",
    }
    panel = schedules.schedule_comparison_panel(DashboardFits.from_artifact(doc))
    label = cell_label(entry["cell"]["size"], entry["cell"]["budget_tokens"])
    (hollow,) = [t for t in panel.figure.data if t.name == f"{OWN}, not identified"]
    i = list(hollow.x).index(label)
    assert hollow.marker.symbol.endswith("-open") and hollow.y[i] == first["diff_own"]
    assert hollow.error_y.array[i] is None
    why = reason_text(Verdict.from_json(ruling))
    assert hollow.text[i] == why
    # The shared reading fails for the same reason: said once, as the report says it.
    (shared,) = [t for t in panel.figure.data if t.name == f"{SHARED}, not identified"]
    i = list(shared.x).index(label)
    assert shared.text[i] == "not identified (as at own optima)"
    assert shared.error_y.array[i] is None
    assert f"{why} in 1 cell(s) ({label})" in panel.caption
    assert not [t for t in panel.figure.data if t.name.startswith("cosine − wsd pooled")]
    assert "pooled over cells: not identified (identified differences in 1" in panel.caption
    assert any("wsd: not identified" in a.text for a in panel.figure.layout.annotations)


def test_runs_at_the_best_trial_carry_no_interval(wsd_fits):
    panel = schedules.schedule_comparison_panel(wsd_fits)
    raw = [t for t in panel.figure.data if t.name.endswith("runs at its best trial")]
    assert len(raw) == 2
    for trace in raw:
        assert trace.error_y.array is None and "interval" not in trace.hovertemplate
    optima = wsd_fits.cell_optima
    assert sum(len(t.y) for t in raw) == sum(1 + len(o.seed_losses) for o in optima)


@pytest.mark.parametrize("reading", ["own", "shared"])
def test_the_hover_is_the_reports_text(wsd_fits, reading):
    from k3scale.scaling.headline import shared_text
    from k3scale.scaling.values.text import diff_text

    panel = schedules.schedule_comparison_panel(wsd_fits)
    name = OWN if reading == "own" else SHARED
    texts = {
        x: t for tr in panel.figure.data if tr.name.startswith(name) for x, t in zip(tr.x, tr.text)
    }
    for d in wsd_fits.schedule_comparison.cells:
        expected = diff_text(d.own) if reading == "own" else shared_text(d)
        label = f"{d.cell['size']}, D="
        if getattr(d, reading).value is not None:
            assert expected in [t for x, t in texts.items() if x.startswith(label)]
    with pytest.raises(K3ScaleError):
        schedules.schedule_comparison_panel(DashboardFits())
