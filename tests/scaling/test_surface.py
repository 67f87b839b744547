"""Chinchilla surface: synthetic recovery, Epoch's reference optimum, VPNLS, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.surface import (
    allocation_exponents,
    coarse_start_grid,
    compute_optimal,
    epoch_start_grid,
    fit_surface,
    fit_surface_vpnls,
)
from tests.scaling.reference import chinchilla_points, reference_file

TRUTH = {"E": 1.8, "A": 480.0, "B": 2100.0, "alpha": 0.35, "beta": 0.37}


def synthetic(seed: int, noise: float = 0.003):
    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(np.log(1e7), np.log(1e10), 120))
    d = np.exp(rng.uniform(np.log(1e9), np.log(1e12), 120))
    clean = TRUTH["E"] + TRUTH["A"] / n ** TRUTH["alpha"] + TRUTH["B"] / d ** TRUTH["beta"]
    return n, d, clean * np.exp(rng.normal(0, noise, len(n)))


def test_epoch_grid_is_the_published_4500_points():
    grid = epoch_start_grid()
    assert grid.shape == (4500, 5)
    assert sorted(set(grid[:, 2])) == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert sorted(set(grid[:, 0])) == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
    assert sorted(set(grid[:, 4])) == [-1.0, -0.5, 0.0, 0.5, 1.0]


def test_recovers_known_parameters_from_noisy_data():
    n, d, loss = synthetic(0)
    fit = fit_surface(n, d, loss, starts=coarse_start_grid())
    assert fit.success, fit.message
    for name in ("E", "alpha", "beta"):
        assert fit.params[name] == pytest.approx(TRUTH[name], rel=0.05), name
    expected_a = TRUTH["beta"] / (TRUTH["alpha"] + TRUTH["beta"])
    assert fit.derived["a"] == pytest.approx(expected_a, abs=0.03)


def test_vpnls_cross_check_agrees_on_synthetic_data():
    n, d, loss = synthetic(1, noise=0.001)
    fit = fit_surface_vpnls(n, d, loss)
    assert fit.success, fit.message
    assert fit.params["alpha"] == pytest.approx(TRUTH["alpha"], rel=0.05)
    assert fit.params["beta"] == pytest.approx(TRUTH["beta"], rel=0.05)


def test_reproduces_epoch_grid_lbfgs_optimum_on_chinchilla():
    table = chinchilla_points()
    assert table.height == 240
    published = json.loads(reference_file("epoch-chinchilla", "published_fits.json").read_text())
    target = published["repo_notebook_outputs"]["grid_LBFGS_huber_sum_optimum"]
    # The test is about the objective and the optimum, not the grid: 72 of Epoch's starts.
    fit = fit_surface(
        table["N_params"],
        table["D_tokens"],
        table["loss"],
        starts=coarse_start_grid(),
        num_resamples=100,
        seed=1,
    )
    assert fit.success, fit.message
    for name in ("E", "alpha", "beta"):
        assert fit.params[name] == pytest.approx(target[name], rel=0.01), name
    for name in ("A", "B"):
        assert fit.params[name] == pytest.approx(target[name], rel=0.05), name
    assert fit.extra["objective_value"] == pytest.approx(target["objective_value"], rel=1e-4)
    assert fit.derived["a"] == pytest.approx(0.513, abs=0.002)
    # Bootstrap SEs near Epoch's notebook (alpha 0.0154, beta 0.0206) within sampling noise.
    se = fit.extra["bootstrap"]["se"]
    assert 0.5 * 0.0154 < se["alpha"] < 2 * 0.0154
    assert 0.5 * 0.0206 < se["beta"] < 2 * 0.0206
    lo, hi = fit.intervals["alpha"]
    assert lo < fit.params["alpha"] < hi


@pytest.mark.slow
def test_full_epoch_grid_reproduces_the_optimum():
    table = chinchilla_points()
    fit = fit_surface(table["N_params"], table["D_tokens"], table["loss"], workers=2)
    assert fit.extra["num_starts"] == 4500
    assert fit.extra["objective_value"] == pytest.approx(0.0010182740, rel=1e-5)
    assert fit.params["alpha"] == pytest.approx(0.34731, rel=1e-3)


def test_compute_optimal_matches_epoch_derived_numbers():
    published = json.loads(reference_file("epoch-chinchilla", "published_fits.json").read_text())
    est = published["published_epoch_estimate"]
    params = {k: est[k]["value"] for k in ("E", "A", "B", "alpha", "beta")}
    derived = published["derived_by_k3scale_research_from_published_point_estimates"]["epoch"]
    opt = compute_optimal(params, np.array([5.88e23]))
    assert opt["n_opt"][0] == pytest.approx(derived["C=5.88e23"]["N"], rel=0.01)
    assert opt["tokens_per_param"][0] == pytest.approx(derived["C=5.88e23"]["D_over_N"], rel=0.01)


@pytest.mark.parametrize(
    ("n", "d", "loss", "fragment"),
    [
        ([1e8] * 3, [1e9] * 3, [3.0] * 3, "more points than"),
        ([1e8, -1, 1e9, 1e10, 2e8, 3e8], [1e9] * 6, [3.0] * 6, "N must be finite and positive"),
        ([1e8] * 6, [1e9] * 6, [3.0, np.nan, 3, 3, 3, 3], "loss must be finite"),
        ([1e8] * 6, [1e9] * 5, [3.0] * 6, "differ in length"),
    ],
)
def test_bad_input_is_a_clear_error(n, d, loss, fragment):
    with pytest.raises(K3ScaleError, match=fragment):
        fit_surface(n, d, loss, starts=coarse_start_grid())


def test_data_that_does_not_scale_reports_failure():
    rng = np.random.default_rng(0)
    n = np.exp(rng.uniform(15, 20, 30))
    d = np.exp(rng.uniform(20, 25, 30))
    loss = 3.0 * (n / 1e8) ** 0.2  # loss grows with N: no positive exponent fits
    fit = fit_surface(n, d, loss, starts=coarse_start_grid())
    assert not fit.success and fit.message


def test_vpnls_survives_a_search_that_drives_a_term_to_underflow():
    """The K2 cell optima of the k2_vs_k3 cpu study (analysis/results): loss nearly flat in N,
    so Nelder-Mead pushes alpha until N^-alpha underflows; this raised a NaN error before."""
    n = np.repeat([291216.0, 669120.0, 1863168.0], 3)
    d = np.tile([196608.0, 49152.0, 98304.0], 3)
    loss = np.array(
        [6.81199, 7.71822, 6.89373, 6.64983, 7.24144, 6.90880, 6.64102, 7.19856, 6.96360]
    )
    fit = fit_surface_vpnls(n, d, loss)
    assert np.isfinite(fit.extra["sse"])
    assert fit.params["alpha"] > 1.5 and fit.params["beta"] > 0


def test_a_refit_with_a_negative_exponent_gives_nan_allocation_not_an_error():
    """A bootstrap resample of a study whose loss hardly depends on one axis can refit with
    beta < 0 (the v2 k2_vs_k3 study's K2 arm did): the allocation constant is undefined there,
    NaN (the bootstrap drops that draw), not a complex number that fails the whole fit."""
    params = {"E": 1.0, "A": 400.0, "B": 2.0, "alpha": 0.34, "beta": -0.05}
    alloc = allocation_exponents(params)
    assert np.isnan(alloc["G"])
    assert alloc["a"] == pytest.approx(-0.05 / 0.29) and alloc["b"] == pytest.approx(0.34 / 0.29)


def test_a_refit_whose_data_term_vanished_gives_inf_allocation_not_an_error():
    params = {"E": 1.0, "A": 400.0, "B": 0.0, "alpha": 0.34, "beta": 0.28}
    assert not np.isfinite(allocation_exponents(params)["G"])
