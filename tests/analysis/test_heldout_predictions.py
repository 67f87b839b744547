"""The held-out check's predictions were registered from the committed v3 fit, and the held-out
presets train where they point (issue 47 item 5)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREDICTIONS = ROOT / "analysis/results/predictions/k2_vs_k3-heldout.json"


def test_the_predictions_name_the_fit_they_came_from():
    doc = json.loads(PREDICTIONS.read_text())
    fit = ROOT / doc["provenance"]["fit"]
    assert hashlib.sha256(fit.read_bytes()).hexdigest() == doc["provenance"]["fit_sha256"]


def test_the_heldout_grids_are_centred_on_the_registered_lr():
    from analysis.heldout import heldout_cells, predicted_lr_centers
    from experiments.k2_vs_k3 import HELDOUT_LR_CENTERS

    registered = predicted_lr_centers(PREDICTIONS)
    assert set(registered) == set(HELDOUT_LR_CENTERS)
    for size, lr in registered.items():
        assert HELDOUT_LR_CENTERS[size] == pytest.approx(lr, rel=1e-3), size  # 4 digits kept
    # The cells registered are the cells the presets plan now (compute to the stored digits).
    doc = json.loads(PREDICTIONS.read_text())
    planned = heldout_cells()
    assert [{**c, "compute": 0} for c in doc["cells"]] == [{**c, "compute": 0} for c in planned]
    for stored, now in zip(doc["cells"], planned, strict=True):
        assert stored["compute"] == pytest.approx(now["compute"], rel=1e-9)


def test_the_readme_s_reading_of_the_scores_holds():
    scored = json.loads((PREDICTIONS.parent / "k2_vs_k3-heldout-scored.json").read_text())
    summary = scored["summary"]
    loglinear = summary["loss | loglinear"]
    assert (loglinear["n"], loglinear["covered"], loglinear["passing"]) == (5, 4, 5)
    rows = scored["rows"]
    (missed,) = [
        r
        for r in rows
        if r["kind"] == "loss" and r["predictor"] == "loglinear" and r["covered"] is False
    ]
    assert missed["arm"] == "k3" and missed["where"].startswith("k3-s4 D=4,729,088")
    assert missed["error"] < 0  # predicted lower than found
    assert summary["lr | lr law"]["covered"] == summary["lr | lr law"]["n"] == 5
    frontier = [r for r in rows if r["kind"] == "frontier"]
    assert all(r["verdict"] != "identified" for r in frontier)  # every law refused
    k2_at_10 = [r for r in frontier if r["arm"] == "k2" and r["where"].startswith("k2-s4 D=2,695")]
    assert all(r["error"] > 0.1 and not r["covered"] for r in k2_at_10)
    m = [r for r in rows if r["kind"] == "M"]
    assert m and all(r["error"] > 2 and r["verdict"] != "identified" for r in m)
    k2_at_20 = [r for r in rows if r["kind"] == "lr" and r["where"].startswith("k2-s4 D=5,390")]
    assert k2_at_20[0]["observed"] is None
