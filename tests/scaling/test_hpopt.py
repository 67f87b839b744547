"""Per-cell HP optimum and the schedule comparison."""

from __future__ import annotations

import numpy as np
import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.hpopt import cell_optimum, smoothing_mode
from k3scale.scaling.schedule_compare import compare_cell


def trials(lr_opt: float, floor: float, seed: int, num: int = 24, lr_range=(1e-3, 3e-2)):
    rng = np.random.default_rng(seed)
    lr = np.exp(rng.uniform(np.log(lr_range[0]), np.log(lr_range[1]), num))
    batch = 2.0 ** rng.integers(12, 17, num)
    loss = (
        floor
        + 0.05 * np.log(lr / lr_opt) ** 2
        + 0.02 * np.log(batch / 2**14) ** 2
        + rng.normal(0, 0.002, num)
    )
    return lr, batch, loss


def test_smoothed_optimum_recovers_lr_and_batch():
    lr, batch, loss = trials(5e-3, 3.0, 0)
    fit = cell_optimum(lr, batch, loss, num_resamples=100)
    assert fit.success and fit.extra["mode"] == "2d"
    assert fit.params["lr_opt"] == pytest.approx(5e-3, rel=0.1)
    assert fit.params["batch_opt"] == pytest.approx(2**14, rel=0.15)
    lo, hi = fit.intervals["lr_opt"]
    assert lo < 5e-3 < hi or abs(np.log(lo / 5e-3)) < 0.1
    assert not any(fit.extra["edge"].values())


def test_optimum_outside_the_searched_range_is_flagged():
    lr, batch, loss = trials(5e-2, 3.0, 1, lr_range=(1e-3, 1e-2))
    fit = cell_optimum(lr, batch, loss, num_resamples=0)
    assert not fit.success
    assert "edge" in fit.message
    assert fit.extra["edge"]["best_lr_on_edge"] or fit.extra["edge"]["smoothed_outside_range"]
    assert fit.params["loss_opt"] == pytest.approx(loss.min())


def test_nan_loss_is_a_clear_error():
    lr, batch, loss = trials(5e-3, 3.0, 2)
    loss[3] = np.nan
    with pytest.raises(K3ScaleError, match="loss must be finite"):
        cell_optimum(lr, batch, loss)


def test_schedule_comparison_finds_the_sign_and_the_lr_ratio():
    cosine = trials(8e-3, 3.000, 3)
    wsd = trials(4e-3, 3.010, 4)
    (entry,) = compare_cell({"cosine": cosine, "wsd": wsd}, "cosine", num_resamples=100).values()
    assert entry["diff_own"] == pytest.approx(-0.010, abs=0.004)
    assert entry["sign_own"] == "cosine lower"
    assert entry["lr_ratio"] == pytest.approx(0.5, rel=0.15)
    # At cosine's lr, WSD pays 0.05 * log(2)^2 ~ 0.024 on top of its own optimum.
    assert entry["diff_shared"] == pytest.approx(-0.034, abs=0.006)
    assert entry["ci"]["diff_own"][1] < 0


def test_schedule_comparison_with_equal_schedules_is_not_resolved():
    a = trials(5e-3, 3.0, 5)
    b = trials(5e-3, 3.0, 6)
    (entry,) = compare_cell({"cosine": a, "wsd": b}, "cosine", num_resamples=100).values()
    assert entry["sign_own"].startswith("not resolved")


def test_smoothing_mode_needs_a_fixed_batch_or_enough_trials_for_2d():
    lr = np.geomspace(1e-3, 1e-2, 8)
    assert smoothing_mode(lr[:5], np.full(5, 64.0)) == "1d"
    assert smoothing_mode(lr[:6], np.array([32.0, 64.0] * 3)) is None
    assert smoothing_mode(lr, np.array([32.0, 64.0, 128.0, 64.0] * 2)) == "2d"
    assert smoothing_mode(np.array([1e-3, 1e-3, 2e-3, 2e-3]), np.full(4, 64.0)) is None


def test_few_trials_at_mixed_batches_report_the_best_trial():
    """Six trials over two batch sizes: a 1-D quadratic would mix them; the best trial stands."""
    lr, batch, loss = trials(5e-3, 3.0, 7, num=6)
    batch = np.array([2.0**13, 2.0**14] * 3)
    fit = cell_optimum(lr, batch, loss, num_resamples=0)
    assert not fit.success and "too few trials" in fit.message
    assert fit.extra["mode"] == "best trial"
    assert fit.params["loss_opt"] == loss.min()
