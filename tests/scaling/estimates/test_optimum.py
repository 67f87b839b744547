"""A cell's fitted optimum: which quadratic, edge verdicts, pooled noise, interval coverage."""

from __future__ import annotations

import numpy as np
import pytest

from k3scale.scaling.estimates.optimum import (
    BestTrial,
    Noise,
    estimate_optimum,
    fit_quadratic,
    pooled_noise,
    quadratic_mode,
)

LRS = np.geomspace(2e-3, 5e-2, 7)


def landscape(lr, batch, lr_star=1e-2, floor=3.0, kappa=0.06):
    return floor + kappa * np.log(lr / lr_star) ** 2 + 0.02 * np.log(batch / 16.0) ** 2


def test_the_quadratic_the_trials_support():
    assert quadratic_mode(LRS[:4], np.full(4, 16.0))[0] == "1d"
    assert quadratic_mode(LRS[:6], np.array([8.0, 16.0, 32.0] * 2))[0] == "1d+batch"
    assert quadratic_mode(LRS, np.array([8.0, 16.0, 32.0, 8.0, 16.0, 32.0, 16.0]))[0] == "2d"
    mode, why = quadratic_mode(LRS[:5], np.array([8.0, 16.0, 32.0, 8.0, 16.0]))
    assert mode is None and "5 trials over 3 batch sizes" in why
    mode, why = quadratic_mode(np.array([1e-3, 1e-3, 2e-3, 2e-3]), np.full(4, 16.0))
    assert mode is None and "2 distinct learning rates" in why


def test_an_optimum_beyond_the_searched_lrs_is_not_identified():
    lr, batch = LRS, np.full(7, 16.0)
    quad, _ = fit_quadratic(lr, batch, landscape(lr, batch, lr_star=0.2))
    opt = estimate_optimum(
        quad, "", BestTrial(0, 0, 0), Noise(0.01, 30, {}), 100, np.random.default_rng(0)
    )
    assert opt.verdict.reason == "fitted optimum at the highest learning rate searched"
    quad, _ = fit_quadratic(lr, batch, landscape(lr, batch, lr_star=1e-2))
    opt = estimate_optimum(
        quad, "", BestTrial(0, 0, 0), Noise(0.01, 30, {}), 100, np.random.default_rng(0)
    )
    assert opt.identified and opt.lr == pytest.approx(1e-2, rel=0.05)
    assert opt.loss == pytest.approx(3.0, abs=1e-9)


def test_without_a_quadratic_the_best_trial_is_reported_with_the_reason():
    opt = estimate_optimum(
        None, "too few", BestTrial(1e-2, 16.0, 3.1), Noise(0.01, 30, {}), 100, None
    )
    assert (opt.loss, opt.lr, opt.draws) == (3.1, 1e-2, None)
    assert opt.verdict.reason == "too few"


def test_pooled_noise_recovers_the_run_noise_and_flags_lack_of_fit():
    rng = np.random.default_rng(1)
    quads = []
    for _ in range(12):
        lr, batch = LRS, np.full(7, 16.0)
        quads.append(fit_quadratic(lr, batch, landscape(lr, batch) + rng.normal(0, 0.02, 7))[0])
    seeds = [list(3.0 + rng.normal(0, 0.02, 3)) for _ in range(12)]
    noise = pooled_noise(quads, seeds)
    assert noise.sd == pytest.approx(0.02, rel=0.15)
    assert noise.df == 12 * 4 + 12 * 2
    assert noise.parts["lack_of_fit_p"] > 0.01
    # Trials that a quadratic cannot follow (a kink), against quiet seeds: lack of fit, and the
    # residual scatter (not the seeds') becomes the noise.
    kinked = [fit_quadratic(LRS, np.full(7, 16.0), 3.0 + 0.3 * np.abs(np.sin(5 * np.log(LRS))))[0]]
    noise = pooled_noise(kinked * 12, seeds)
    assert noise.parts["lack_of_fit_p"] < 0.01
    assert noise.sd == pytest.approx(noise.parts["quadratic_residual_sd"])


@pytest.mark.parametrize("batches", [(16.0,), (8.0, 16.0, 32.0)], ids=["1d", "2d"])
def test_the_interval_covers_the_true_optimum_about_95_percent(batches):
    """400 simulated cells: trials around a known optimum with noise 0.02, 3 seed re-runs each
    for the noise; the 95% interval of the fitted optimum must cover the truth 91-99% of the
    time (binomial sd at 400 draws is 1.1 points)."""
    rng = np.random.default_rng(7)
    covered = identified = 0
    for _ in range(400):
        lr = np.tile(LRS, len(batches))
        batch = np.repeat(batches, len(LRS))
        loss = landscape(lr, batch, lr_star=1e-2 * np.exp(rng.normal(0, 0.3)))
        quad, _ = fit_quadratic(lr, batch, loss + rng.normal(0, 0.02, len(lr)))
        seeds = [list(rng.normal(0, 0.02, 3))]
        noise = pooled_noise([quad], seeds)
        opt = estimate_optimum(quad, "", BestTrial(0, 0, 0), noise, 300, rng)
        if opt.identified:
            identified += 1
            lo, hi = opt.interval()
            covered += lo <= 3.0 <= hi
    assert identified > 300
    assert 0.91 <= covered / identified <= 0.99, covered / identified
