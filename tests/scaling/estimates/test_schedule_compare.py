"""Schedule comparison of fitted optima, per cell and pooled over clusters of cells."""

from __future__ import annotations

import numpy as np
import pytest

from k3scale.scaling.estimates.optimum import BestTrial, Noise, estimate_optimum, fit_quadratic
from k3scale.scaling.estimates.schedule_compare import CellComparison, compare_cell, pooled
from k3scale.scaling.values.fitdoc import CellDifference
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.scaling.values.verdict import Verdict

LRS = np.geomspace(2e-3, 5e-2, 7)
NOISE = Noise(0.01, 40, {})


def optimum(floor, lr_star, seed, batch=16.0):
    loss = floor + 0.05 * np.log(LRS / lr_star) ** 2
    quad, _ = fit_quadratic(LRS, np.full(7, batch), loss)
    return estimate_optimum(quad, "", BestTrial(0, 0, 0), NOISE, 400, np.random.default_rng(seed))


def test_a_cell_reads_own_optima_and_the_shared_setting():
    cosine, wsd = optimum(3.000, 1e-2, 0), optimum(3.010, 5e-3, 1)
    result = compare_cell(cosine, wsd, "cosine", "wsd")
    entry, draws = result.difference.to_json(), result.own_draws
    # The minimum is read on a 121-point LR grid: within 0.05 * (grid step / 2)^2 of the vertex.
    assert entry["diff_own"] == pytest.approx(-0.010, abs=2e-5)
    assert entry["ci_own"][0] < -0.010 < entry["ci_own"][1]
    assert entry["lr_ratio"] == pytest.approx(0.5, rel=0.05)
    # At cosine's LR, WSD pays 0.05 * log(2)^2 = 0.024 on top of its own optimum.
    assert entry["diff_shared"] == pytest.approx(-0.034, abs=1e-3)
    assert entry["verdict_own"] == entry["verdict_shared"] == "identified"
    assert draws.shape == (400,)


def test_a_cell_with_an_unidentified_optimum_says_which_and_why():
    edge = optimum(3.0, 0.5, 0)  # optimum far above the searched LRs
    result = compare_cell(optimum(3.0, 1e-2, 1), edge, "cosine", "wsd")
    entry, draws = result.difference.to_json(), result.own_draws
    assert draws is None and entry["ci_own"] is None
    assert entry["verdict_own"] == (
        "not identified: wsd optimum: fitted optimum at the highest learning rate searched"
    )
    assert entry["sign_own"] == "not identified"


def test_the_shared_setting_needs_the_batch_the_other_schedule_ran():
    entry = compare_cell(
        optimum(3.0, 1e-2, 0), optimum(3.0, 1e-2, 1, batch=32.0), "c", "w"
    ).difference.to_json()
    assert entry["diff_shared"] is None
    assert "never ran the reference's batch size" in entry["verdict_shared"]


def _difference(value: float) -> CellComparison:
    """A cell's difference with draws (the pooled reading uses the point and the draws' presence)."""
    own = Estimate(value, [value - 0.01, value + 0.01], Verdict())
    difference = CellDifference({}, "cosine", "wsd", own, own, 1.0, 1.0, {})
    return CellComparison(difference, np.zeros(10))


def test_pooled_reading_counts_clusters_not_cells():
    entries = [_difference(d) for d in (-0.02, -0.01, -0.015)]
    one_size = pooled(entries, ["t1", "t1", "t1"], "cosine", "wsd")
    assert one_size.mean.verdict.reason.startswith("identified differences in 1")
    three = pooled(entries, ["t1", "t2", "t3"], "cosine", "wsd")
    assert three.mean.value == pytest.approx(-0.015)
    assert three.mean.interval[1] < 0 and three.consistent
    assert three.point_signs == {"cosine lower": 3, "wsd lower": 0}
    mixed = [*entries, _difference(0.03)]
    result = pooled(mixed, ["t1", "t2", "t3", "t4"], "cosine", "wsd")
    assert not result.consistent and result.point_signs["wsd lower"] == 1
