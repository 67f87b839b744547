"""Laws tested where they were not fitted: leave one rung out, and registered predictions scored
(issue 47 items 4 and 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3scale.scaling import heldout_score, holdout
from k3scale.scaling.predict import CellQuery, forecast
from k3scale.scaling.values.fitdoc import read_cell_optima

ROOT = Path(__file__).resolve().parents[2]
V3 = ROOT / "analysis/results/k2_vs_k3-cpu_v3"


def test_a_prediction_scores_its_error_and_whether_its_interval_holds():
    from k3scale.scaling.predict import Prediction
    from k3scale.scaling.values.verdict import Verdict

    p = Prediction(3.70, [3.65, 3.75], Verdict(), 2.0)
    inside = holdout.score("s", "k2", "c", "loglinear", 3.72, p)
    assert inside.error == pytest.approx(-0.02) and inside.covered
    outside = holdout.score("s", "k2", "c", "loglinear", 3.80, p)
    assert not outside.covered
    assert holdout.Score.from_json(json.loads(json.dumps(outside.to_json()))) == outside


def test_leaving_the_top_rung_out_predicts_exactly_the_cells_it_left_out():
    scores = holdout.leave_top_rung_out(V3, "k2_vs_k3", num_resamples=100)
    left_out = {s.cell for s in scores}
    assert left_out == {
        f"{o.cell['size']} D={o.tokens:,.0f}"
        for o in read_cell_optima(json.loads((V3 / "fit.json").read_text())["results"])
        if o.cell["size"].endswith("s3")
    }
    assert {s.predictor for s in scores} >= {"loglinear", "frontier envelope"}
    # Every cell prediction reaches past what the reduced fit saw (a larger N); a frontier
    # prediction may not (s3 at 5 tokens per parameter costs less than s2 at 20).
    cells = [s for s in scores if s.predictor == "loglinear" and s.predicted is not None]
    assert cells and all(s.extrapolation > 1 for s in cells)


def test_registered_predictions_score_against_the_runs_that_check_them():
    """The plumbing, on cells whose optima are known: predictions made from the v3 fit for its
    own s3 cells, scored against that fit as if it were the held-out study."""
    doc = json.loads((V3 / "fit.json").read_text())
    optima = [o for o in read_cell_optima(doc["results"]) if o.cell["size"].endswith("s3")]
    cells = [
        {
            "arch": o.cell["arch"],
            "size": o.cell["size"],
            "n": o.n,
            "tokens": o.tokens,
            "compute": o.compute["c_6n"],
        }
        for o in optima
    ]
    queries = [CellQuery(c["arch"], c["n"], c["tokens"]) for c in cells]
    predictions = forecast(doc, sorted({c["compute"] for c in cells}), queries, "c_6n")
    predictions["cells"] = cells
    result = heldout_score.score(predictions, doc, doc)
    losses = [r for r in result["rows"] if r["kind"] == "loss" and r["predictor"] == "loglinear"]
    assert len(losses) == len(optima)
    # Fitted on these very cells, the log-linear surface's interval holds each of them.
    assert all(r["covered"] for r in losses)
    lrs = [r for r in result["rows"] if r["kind"] == "lr"]
    assert all(r["error"] > 0 for r in lrs)  # a ratio predicted / located
    assert "loss | loglinear" in result["summary"]
    table = heldout_score.markdown(result)
    assert "| loss | loglinear |" in table and "None" not in table
