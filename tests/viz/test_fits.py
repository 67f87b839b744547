"""What the dashboards read from a fit artifact: fitdoc's records, as the report reads them."""

from __future__ import annotations

import copy
import json

import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.answers import answer_lines
from k3scale.scaling.headline import headline_lines
from k3scale.scaling.values import fitdoc
from k3scale.scaling.values.result import FitResult
from k3scale.viz.fits import DashboardFits


def test_the_records_are_fitdocs(fits, fit_document):
    results = fit_document["results"]
    assert list(fits.cell_optima) == fitdoc.read_cell_optima(results)
    assert fits.comparisons == fitdoc.read_comparisons(results)
    assert fits.schedule_comparison is None
    assert {o.loss.identified for o in fits.cell_optima} == {True, False}
    assert fits.multipliers() == [("c_6n", "k2", "k3"), ("c_attn", "k2", "k3")]
    assert fits.loss == "final_val_ood_loss" and fits.analysis == "k2_vs_k3"
    # The page opens with the one-line answers; the report's headline lines are folded below.
    assert list(fits.answers) == answer_lines(fit_document)
    assert list(fits.headline) == headline_lines(fit_document)


def test_lookups_by_arch_schedule_and_convention(fits, wsd_fits, artifacts, fit_document):
    k3 = fits.optima(arch="k3", schedule="cosine")
    assert k3 and all(o.cell["arch"] == "k3" and o.cell["schedule"] == "cosine" for o in k3)
    stored = artifacts["cosine_vs_wsd"]["results"]
    assert wsd_fits.schedule_comparison == fitdoc.read_schedule_comparison(stored)
    laws = stored["per_schedule"]
    found = 0
    for schedule, part in laws.items():
        for conv, targets in part["hp_laws"].items():
            for target in ("lr_opt", "batch_opt"):
                law = wsd_fits.hp_law(schedule, target, conv)
                doc = targets.get(target, {})
                if "C" in doc and "skipped" not in doc["C"]:
                    assert law == FitResult.from_dict(doc["C"])
                    found += 1
                else:
                    assert law is None
    assert found > 0
    routes = fit_document["results"]["compute_optimal"]["c_6n"]["routes"]
    stored_k3 = fitdoc.SurfaceRecord.from_json(routes["surface"]["arms"]["k3"]["surface"])
    assert fits.surface(("k3", "cosine")) == (stored_k3, "")


def test_skipped_fits_keep_their_reasons(fit_document, artifacts):
    doc = copy.deepcopy(fit_document)
    doc["results"]["compute_optimal"]["c_attn"] = {"skipped": "needs two arch values"}
    doc["results"]["compute_optimal"]["c_6n"]["routes"]["surface"] = {"skipped": "no surface"}
    fits = DashboardFits.from_artifact(doc)
    assert fits.multipliers() == [("c_6n", "k2", "k3")]
    assert fits.comparisons["c_attn"].skipped == "needs two arch values"
    assert fits.surface(("k3",)) == (
        None,
        "surface route (c_6n) skipped by `k3scale fit`: no surface",
    )
    wsd = copy.deepcopy(artifacts["cosine_vs_wsd"])
    wsd["results"]["per_schedule"]["wsd"]["hp_laws"]["c_6n"]["batch_opt"] = {"skipped": "flat"}
    wsd["results"]["per_schedule"]["cosine"]["hp_laws"]["c_attn"] = {"skipped": "few cells"}
    fits = DashboardFits.from_artifact(wsd)
    assert "batch_opt law of wsd (c_6n) skipped: flat" in fits.notes
    assert "lr_opt and batch_opt laws of cosine (c_attn) skipped: few cells" in fits.notes
    assert fits.hp_law("wsd", "batch_opt", "c_6n") is None


def test_only_an_artifact_of_this_schema_is_read(fit_document):
    # The hand-made sections of earlier dashboards are gone: one estimator per number.
    with pytest.raises(K3ScaleError, match="not a `k3scale fit` artifact"):
        DashboardFits.from_artifact({"frontiers": [], "multipliers": []})
    old = copy.deepcopy(fit_document)
    old["provenance"]["artifact_version"] = 1
    with pytest.raises(K3ScaleError, match=r"artifact version 1.*rerun `k3scale fit k2_vs_k3`"):
        DashboardFits.from_artifact(old)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["results"]["cell_optima"][0].pop("loss"),
        lambda d: d["results"]["cell_optima"][0].update(verdict="fine"),
        lambda d: d["results"]["compute_optimal"]["c_6n"].pop("routes"),
    ],
)
def test_a_malformed_artifact_is_one_error(fit_document, edit):
    doc = copy.deepcopy(fit_document)
    edit(doc)
    with pytest.raises(K3ScaleError, match="fit file: malformed artifact"):
        DashboardFits.from_artifact(doc)


def test_dashboard_warns_when_the_artifact_was_fitted_on_another_table(tmp_path, fit_document):
    from k3scale.commands.dashboard import render
    from tests.viz.conftest import DATA

    doc = copy.deepcopy(fit_document)
    doc["provenance"]["table_hash"] = "0" * 64
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(doc))
    text, panels, _ = render(DATA, path, "k2_vs_k3", "final_val_ood_loss", "file")
    assert "WARNING: fitted on a different run table" in text
    assert any(p.key == "multiplier-k3-over-k2-c_6n" for p in panels)
