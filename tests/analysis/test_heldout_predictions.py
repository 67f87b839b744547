"""The held-out check's predictions were registered from the committed v3 fit, and the held-out
presets train where they point (issue 47 item 5)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREDICTIONS = ROOT / "analysis/results/predictions/k2_vs_k3-heldout.json"


def test_the_predictions_name_the_fit_they_came_from():
    # The fit is refitted as the code changes; the one registered from is the fit committed
    # with the predictions' last change, read from the repository's history.
    provenance = json.loads(PREDICTIONS.read_text())["provenance"]
    last = _git("log", "-1", "--format=%H", "--", str(PREDICTIONS.relative_to(ROOT)))
    if last is None or not last.strip():
        pytest.skip("this clone lacks the commit that registered the predictions (shallow)")
    registered = last.decode().strip()
    fit = _git("show", f"{registered}:{provenance['fit']}")
    assert hashlib.sha256(fit).hexdigest() == provenance["fit_sha256"]
    fitted_by = json.loads(fit)["provenance"]["code"]
    assert fitted_by["git_sha"] == provenance["fit_commit"] and not fitted_by["git_dirty"]


def _git(*args: str) -> bytes | None:
    shown = subprocess.run(["git", *args], cwd=ROOT, capture_output=True)
    return shown.stdout if shown.returncode == 0 else None


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
    # K3 at the held-out computes reaches losses K2 never reached: no monotone frontier through
    # the optima bounds M(C) there, so nothing is observed to score a law's M against.
    assert m and all(r["missing"].startswith("not observed: a bound on M(C)") for r in m)
    k2_at_20 = [r for r in rows if r["kind"] == "lr" and r["where"].startswith("k2-s4 D=5,390")]
    assert k2_at_20[0]["observed"] is None
