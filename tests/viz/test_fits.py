"""Fit JSON adapter: native k3scale/scaling outputs and the dashboard's own sections."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.frontier import predict_frontier
from k3scale.viz.fits import fits_from_json


def test_fixture_document_parses_into_every_section(fits, fit_document):
    assert len(fits.frontiers) == 2 * len(fit_document["frontier_comparisons"]) == 6
    assert len(fits.multipliers) == 3
    assert len(fits.hp_laws) == 8
    assert len(fits.surfaces) == 4
    comp = fit_document["frontier_comparisons"][0]
    k3 = fits.frontier("k3", comp["fixed"], comp["compute"])
    source = comp["result"]["groups"]["k3"]
    assert k3.params == {p: source[p] for p in ("E", "A", "alpha")}
    assert k3.intervals["alpha"] == source["ci"]["alpha"]
    assert k3.band.x == tuple(comp["bands"]["k3"]["x"])
    c = np.geomspace(1e10, 1e13, 7)
    np.testing.assert_allclose(k3.predict(c), predict_frontier(source, c), rtol=1e-14)


def test_multiplier_band_comes_from_the_comparison_entries(fits, fit_document):
    comp = fit_document["frontier_comparisons"][0]
    m = next(
        x for x in fits.multipliers if (x.fixed, x.compute) == (comp["fixed"], comp["compute"])
    )
    entries = sorted(comp["result"]["multiplier"], key=lambda e: e["compute"])
    assert m.band.median == tuple(e["value"] for e in entries)
    assert m.band.lo == tuple(e["ci"][0] for e in entries)
    assert (m.base, m.new) == ("k2", "k3")
    shared = comp["result"]["shared_exponent"]
    assert m.shared_k == shared["multiplier"]
    assert m.shared_accepted is (not shared["rejected"])


def test_a_not_identified_multiplier_is_listed_not_drawn(fit_document):
    from k3scale.viz.dashboard import PanelList
    from k3scale.viz.frontier import multiplier_panel

    document = copy.deepcopy(fit_document)
    entries = document["frontier_comparisons"][0]["result"]["multiplier"]
    for entry in entries:
        entry["verdict"] = "not identified: M(C) interval spans 60.0 decades (> 1)"
    (blank,) = [m for m in fits_from_json(document).multipliers if not m.band.x]
    assert len(blank.not_identified) == len(entries)
    page = PanelList()
    page.add(multiplier_panel, blank)
    assert not page.panels
    (line,) = page.skipped
    assert "not drawn" in line and "60.0 decades" in line
    entries[0]["verdict"] = "identified"
    (drawn,) = [m for m in fits_from_json(document).multipliers if len(m.band.x) == 1]
    assert drawn.band.median == (entries[0]["value"],)
    assert len(drawn.not_identified) == len(entries) - 1


def test_hp_law_maps_power_law_params(fits, fit_document):
    entry = fit_document["hp_power_laws"][0]
    law = fits.hp_law(entry["arch"], entry["schedule"], entry["target"], entry["compute"])
    assert (law.coef, law.exponent) == (
        entry["fit"]["params"]["k"],
        entry["fit"]["params"]["exp_C"],
    )
    c = np.array([1e11, 1e12])
    np.testing.assert_allclose(law.predict(c), law.coef * c**law.exponent)


def test_own_sections_parse():
    band = {"x": [1e10, 1e11], "lo": [1.5, 1.6], "hi": [3.0, 3.5], "median": [2.0, 2.5]}
    doc = {
        "frontiers": [
            {
                "arch": "k3",
                "schedule": "cosine",
                "compute": "c_attn",
                "fit": {
                    "params": {"E": 2.0, "A": 50.0, "alpha": 0.2},
                    "success": True,
                    "extra": {"compute_range": [1e10, 1e12]},
                },
            }
        ],
        "multipliers": [
            {
                "base": "k2",
                "new": "k3",
                "fixed": "cosine",
                "band": band,
                "data_range": [1e10, 1e11],
                "shared": {"k": 2.5, "interval": [2.1, 2.9], "accepted": True},
            }
        ],
        "hp_laws": [
            {
                "arch": "k3",
                "schedule": "wsd",
                "target": "lr",
                "fit": {"params": {"coef": 3.0, "exponent": -0.3}},
            }
        ],
        "surfaces": [
            {
                "arch": "k3",
                "schedule": "cosine",
                "fit": {"params": {"E": 1.8, "A": 400.0, "B": 400.0, "alpha": 0.34, "beta": 0.28}},
            }
        ],
    }
    fits = fits_from_json(doc)
    assert fits.frontier("k3", "cosine", "c_attn").data_range == (1e10, 1e12)
    assert fits.multipliers[0].shared_k_interval == (2.1, 2.9)
    assert fits.hp_law("k3", "wsd", "lr", "c_6n").exponent == -0.3
    surf = fits.surface("k3", "cosine")
    assert surf.predict(1e6, 1e9) == pytest.approx(1.8 + 400 / 1e6**0.34 + 400 / 1e9**0.28)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("frontier_comparisons", 0, "result", "groups", "k2", "alpha"), None, "alpha"),
        (("hp_power_laws", 0, "target"), "momentum", "target must be one of"),
        (("frontier_comparisons", 0, "bands", "k2", "lo"), [1.0], "differ in length"),
        (("surfaces",), {"not": "a list"}, "surfaces must be a list"),
    ],
)
def test_malformed_documents_name_the_field(fit_document, path, value, message):
    doc = copy.deepcopy(fit_document)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    with pytest.raises(K3ScaleError, match=message):
        fits_from_json(doc)


def _artifact(fit_document: dict, table_hash: str) -> dict:
    """A `k3scale fit k2_vs_k3`-shaped artifact around real scaling outputs of the fixture."""
    comps = {
        c["compute"]: c for c in fit_document["frontier_comparisons"] if c["fixed"] == "cosine"
    }
    surfaces = {s["arch"]: s["fit"] for s in fit_document["surfaces"] if s["schedule"] == "cosine"}
    return {
        "analysis": "k2_vs_k3",
        "provenance": {"table_hash": table_hash},
        "results": {
            "cell_optima": [{"cell": {"arch": a, "schedule": "cosine"}} for a in ("k2", "k3")],
            "frontiers": {
                "c_6n": comps["c_6n"]["result"],
                "c_attn": {"skipped": "needs two arch values"},
            },
            "per_arch": {
                "k2": {"surface": {"skipped": "too few sizes"}},
                "k3": {"surface": surfaces["k3"]},
            },
        },
    }


def test_fit_artifact_is_translated_with_its_skip_notes(fit_document):
    fits = fits_from_json(_artifact(fit_document, "abc"))
    assert {(f.arch, f.schedule, f.compute) for f in fits.frontiers} == {
        ("k2", "cosine", "c_6n"),
        ("k3", "cosine", "c_6n"),
    }
    assert [(m.base, m.new, m.fixed) for m in fits.multipliers] == [("k2", "k3", "cosine")]
    assert [s.arch for s in fits.surfaces] == ["k3"]
    assert any("c_attn" in n and "needs two arch values" in n for n in fits.notes)
    assert any("surface fit of k2" in n for n in fits.notes)


def test_dashboard_warns_when_the_artifact_was_fitted_on_another_table(tmp_path, fit_document):
    import json

    from k3scale.commands.dashboard import render
    from tests.viz.conftest import DATA

    path = tmp_path / "fit.json"
    path.write_text(json.dumps(_artifact(fit_document, "0" * 64)))
    text, panels, notes = render(DATA, path, "k2_vs_k3", "final_val_ood_loss", "file")
    assert "WARNING: fitted on a different run table" in text
    assert any("needs two arch values" in n for n in notes)
    assert any(p.key == "multiplier-k3-over-k2-cosine-c_6n" for p in panels)
