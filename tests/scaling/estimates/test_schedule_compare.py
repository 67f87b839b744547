"""Schedule comparison of fitted optima, per cell and pooled over cells (paired by seed)."""

from __future__ import annotations

import numpy as np
import pytest

from k3scale.scaling.estimates.optimum import BestTrial, Noise, estimate_optimum, fit_quadratic
from k3scale.scaling.estimates.schedule_compare import CellComparison, compare_cell, pooled
from k3scale.scaling.values.fitdoc import CellDifference
from k3scale.scaling.values.uncertainty import Estimate, percentile_interval
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


def _difference(value: float, draws) -> CellComparison:
    """A cell's difference with its draws."""
    own = Estimate(value, [value - 0.01, value + 0.01], Verdict())
    difference = CellDifference({}, "cosine", "wsd", own, own, 1.0, 1.0, {})
    return CellComparison(difference, np.asarray(draws, dtype=float))


def _paired_cells(values, shared_sd=0.01, own_sd=0.002, draws=400) -> list[CellComparison]:
    """Cells whose draws share one seed term (as cells on the same seeds do) plus their own."""
    rng = np.random.default_rng(0)
    shared = rng.normal(0.0, shared_sd, draws)
    return [_difference(v, v + shared + rng.normal(0.0, own_sd, draws)) for v in values]


def test_pooled_interval_is_read_off_the_mean_of_the_cells_draws():
    entries = _paired_cells((-0.02, -0.01, -0.015))
    result = pooled(entries, ["t1", "t1", "t1"], "cosine", "wsd")
    assert result.mean.value == pytest.approx(-0.015)
    expected = percentile_interval(np.mean([e.own_draws for e in entries], axis=0))
    assert result.mean.interval == pytest.approx(expected)
    # The shared term does not average out over cells: the interval keeps its width.
    assert result.mean.interval[1] - result.mean.interval[0] > 3.0 * 0.01
    assert result.across_sizes.verdict.reason.startswith("identified differences in 1")


def test_pooled_reading_counts_clusters_for_the_check_across_sizes():
    entries = _paired_cells((-0.02, -0.01, -0.015), shared_sd=0.001)
    three = pooled(entries, ["t1", "t2", "t3"], "cosine", "wsd")
    assert three.across_sizes.value == pytest.approx(-0.015)
    assert three.across_sizes.interval[1] < 0 and three.mean.interval[1] < 0
    assert three.consistent
    assert three.point_signs == {"cosine lower": 3, "wsd lower": 0}
    mixed = [*entries, *_paired_cells((0.03,))]
    result = pooled(mixed, ["t1", "t2", "t3", "t4"], "cosine", "wsd")
    assert not result.consistent and result.point_signs["wsd lower"] == 1


def test_cells_without_draws_pool_a_point_without_an_interval():
    entries = [_difference(-0.01, []), _difference(-0.02, [])]
    result = pooled(entries, ["t1", "t2"], "cosine", "wsd")
    assert result.mean.value == pytest.approx(-0.015) and result.mean.interval is None
    assert "no draws" in result.mean.verdict.reason and not result.consistent
