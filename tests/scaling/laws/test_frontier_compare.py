"""Frontier comparison (methods.md 2.6): M(C) by grid inversion, crossovers, shared exponent."""

from __future__ import annotations

import numpy as np
import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.laws.frontier import predict_frontier
from k3scale.scaling.laws.frontier_compare import (
    INVERSION_POINTS_PER_DECADE,
    compare_frontiers,
    frontier_multiplier,
    inversion_grid,
)

BASE = {"E": 2.0, "A": 2000.0, "alpha": 0.2}


def closed_form_multiplier(base: dict, new: dict, compute: np.ndarray) -> np.ndarray:
    """C_base(L_new(C)) / C with C_base(L) = (A_b / (L - E_b))^(1 / alpha_b): the reference."""
    gap = predict_frontier(new, compute) - base["E"]
    return (base["A"] / gap) ** (1.0 / base["alpha"]) / compute


def two_groups(new_loss, seed: int = 0, num: int = 16, noise: float = 0.002):
    rng = np.random.default_rng(seed)
    c = np.logspace(16, 20, num)
    base = predict_frontier(BASE, c) * np.exp(rng.normal(0, noise, num))
    new = new_loss(c) * np.exp(rng.normal(0, noise, num))
    return (np.concatenate([c, c]), np.concatenate([base, new]), ["k2"] * num + ["k3"] * num)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 2.0])
def test_grid_inversion_is_within_its_stated_bound_of_the_closed_form(alpha):
    base = {"E": 2.0, "A": 50.0 * 1e18**alpha, "alpha": alpha}
    new = {"E": 2.0, "A": 40.0 * 1e18 ** (1.2 * alpha), "alpha": 1.2 * alpha}
    at = np.logspace(16, 20, 41)
    exact = closed_form_multiplier(base, new, at)
    assert np.all(np.isfinite(exact)) and exact.max() / exact.min() > 2
    got = frontier_multiplier(base, new, at, inversion_grid(at))
    # Linear interpolation between grid losses: |error in log M| <= alpha h^2 / 8 to first order
    # in h (the worst point, midway between two grid losses, meets it to 4 digits).
    bound = alpha * (np.log(10) / INVERSION_POINTS_PER_DECADE) ** 2 / 8
    assert np.max(np.abs(np.log(got / exact))) <= 1.01 * bound
    assert bound <= 1.4e-6


def test_a_compute_shift_gives_its_factor_and_a_loss_below_the_floor_none():
    new = {"E": 2.0, "A": 2000.0 * 2.5**-0.2, "alpha": 0.2}  # L_new(C) = L_base(2.5 C)
    at = np.array([1e17, 1e19])
    got = frontier_multiplier(BASE, new, at, inversion_grid(at))
    assert got == pytest.approx([2.5, 2.5], rel=1e-6)
    below = {"E": 1.5, "A": 10.0, "alpha": 0.2}  # L_new(1e30) < E_base: no baseline compute
    assert np.isnan(frontier_multiplier(BASE, below, [1e30], inversion_grid([1e30]))[0])


def test_equal_exponents_give_one_multiplier_near_2_5():
    c, loss, groups = two_groups(lambda c: predict_frontier(BASE, 2.5 * c))
    out = compare_frontiers(c, loss, groups, "k2", at=[1e17, 1e19], num_resamples=60, seed=0)
    shared = out["shared_exponent"]
    assert not shared["rejected"], shared
    assert shared["multiplier"] == pytest.approx(2.5, rel=0.15)
    lo, hi = shared["ci"]
    assert lo <= 2.5 <= hi
    for entry in out["multiplier"]:
        assert entry["ci"][0] <= 2.5 <= entry["ci"][1], entry
        assert not entry["extrapolated"]
        assert entry["verdict"] == "identified"


def test_different_exponents_vary_with_compute_and_reject_sharing():
    # New arm: steeper (alpha 0.3), equal to the baseline at C = 1e18.
    a_new = 2000.0 * 1e18 ** (0.3 - 0.2)
    c, loss, groups = two_groups(lambda c: 2.0 + a_new * c**-0.3)
    out = compare_frontiers(c, loss, groups, "k2", at=[1e16, 1e18, 1e20], num_resamples=30)
    values = [m["value"] for m in out["multiplier"]]
    assert values[0] < 0.8 and values[2] > 1.5 and values[1] == pytest.approx(1.0, abs=0.15)
    assert out["shared_exponent"]["rejected"]
    assert out["shared_exponent"]["p_value"] < 1e-3
    assert out["shared_exponent"]["multiplier"] is None
    (cross,) = out["crossovers"]["k3"]
    assert cross == pytest.approx(1e18, rel=0.5)


def test_crossover_of_noise_free_curves_is_where_they_meet():
    a_new = 2000.0 * 1e18 ** (0.3 - 0.2)
    c, loss, groups = two_groups(lambda c: 2.0 + a_new * c**-0.3, noise=0.0)
    out = compare_frontiers(c, loss, groups, "k2", at=[1e18])
    (cross,) = out["crossovers"]["k3"]
    assert cross == pytest.approx(1e18, rel=1e-3)
    assert out["multiplier"][0]["value"] == pytest.approx(1.0, rel=1e-3)


def test_an_extrapolated_compute_is_flagged_and_not_identified():
    c, loss, groups = two_groups(lambda c: predict_frontier(BASE, 2.5 * c))
    out = compare_frontiers(c, loss, groups, "k2", at=[1e14, 1e18], num_resamples=20)
    far, inside = out["multiplier"]
    assert far["extrapolated"] and far["verdict"].startswith("not identified: extrapolated")
    assert far["value"] == pytest.approx(2.5, rel=0.15)
    assert not inside["extrapolated"]


def test_a_group_with_one_size_is_a_clear_error():
    c, loss, groups = two_groups(lambda c: predict_frontier(BASE, 2.5 * c), num=8)
    c[8:] = 1e18
    with pytest.raises(K3ScaleError, match="group 'k3' needs at least 3 distinct compute"):
        compare_frontiers(c, loss, groups, "k2")


def test_unknown_baseline_is_a_clear_error():
    c, loss, groups = two_groups(lambda c: predict_frontier(BASE, 2.5 * c), num=8)
    with pytest.raises(K3ScaleError, match="baseline 'k1' not among groups"):
        compare_frontiers(c, loss, groups, "k1")
