"""Compute multiplier M(C), shared-exponent test, crossovers (methods.md 2.6)."""

from __future__ import annotations

import numpy as np
import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.frontier import predict_frontier
from k3scale.scaling.frontier_compare import compare_frontiers
from k3scale.scaling.multiplier import crossovers, multiplier_at

BASE = {"E": 2.0, "A": 2000.0, "alpha": 0.2}


def two_groups(new_loss, seed: int = 0, num: int = 16, noise: float = 0.002):
    rng = np.random.default_rng(seed)
    c = np.logspace(16, 20, num)
    base = predict_frontier(BASE, c) * np.exp(rng.normal(0, noise, num))
    new = new_loss(c) * np.exp(rng.normal(0, noise, num))
    return (np.concatenate([c, c]), np.concatenate([base, new]), ["k2"] * num + ["k3"] * num)


def test_multiplier_formula_is_exact_for_a_compute_shift():
    new = {"E": 2.0, "A": 2000.0 * 2.5**-0.2, "alpha": 0.2}  # L_new(C) = L_base(2.5 C)
    assert multiplier_at(BASE, new, [1e17, 1e19]) == pytest.approx([2.5, 2.5], rel=1e-9)
    below = {"E": 1.5, "A": 10.0, "alpha": 0.2}
    assert np.isnan(multiplier_at(BASE, below, [1e30])[0])  # L_new below E_base: no match


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


def test_crossovers_of_exact_curves():
    new = {"E": 2.0, "A": 2000.0 * 1e18**0.1, "alpha": 0.3}
    (root,) = crossovers(BASE, new, 1e15, 1e21)
    assert root == pytest.approx(1e18, rel=1e-6)


def test_a_group_with_one_size_is_a_clear_error():
    c, loss, groups = two_groups(lambda c: predict_frontier(BASE, 2.5 * c), num=8)
    c[8:] = 1e18
    with pytest.raises(K3ScaleError, match="group 'k3' needs at least 3 distinct compute"):
        compare_frontiers(c, loss, groups, "k2")


def test_unknown_baseline_is_a_clear_error():
    c, loss, groups = two_groups(lambda c: predict_frontier(BASE, 2.5 * c), num=8)
    with pytest.raises(K3ScaleError, match="baseline 'k1' not among groups"):
        compare_frontiers(c, loss, groups, "k1")
