"""Measured-only schedule readings: the pooled run noise and the paired differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from k3scale.scaling import measured


def test_run_noise_is_the_sd_of_rerun_differences_over_root_two():
    pairs = [(7.0, [7.02]), (6.5, [6.47, 6.53]), (6.0, [6.05]), (5.0, [4.99])]
    diffs = [0.02, -0.03, 0.03, 0.05, -0.01]
    noise = measured.run_noise_sd(pairs)
    assert noise["pairs"] == 5
    assert noise["sd"] == pytest.approx(np.std(diffs, ddof=1) / math.sqrt(2))
    assert noise["mean_rerun_minus_best"] == pytest.approx(np.mean(diffs))


def test_too_few_reruns_give_no_noise_and_no_intervals():
    noise = measured.run_noise_sd([(7.0, [7.01]), (6.0, [6.02])])
    assert noise["sd"] is None
    reading = measured.difference([7.0], [6.9], noise["sd"])
    assert reading["value"] == pytest.approx(0.1) and "ci" not in reading


def test_difference_interval_shrinks_with_more_runs():
    one = measured.difference([7.0], [6.9], 0.02)
    two = measured.difference([7.0, 7.02], [6.9, 6.92], 0.02)
    assert one["ci"][1] - one["ci"][0] == pytest.approx(2 * 1.959964 * 0.02 * math.sqrt(2))
    assert two["ci"][1] - two["ci"][0] == pytest.approx(
        (one["ci"][1] - one["ci"][0]) / math.sqrt(2)
    )
    assert two["value"] == pytest.approx(0.1)


def test_cell_readings_include_only_what_was_run():
    readings = measured.cell_readings((7.0, 6.9), ([7.01], []), [], 0.02)
    assert set(readings) == {"best_trials"}
    readings = measured.cell_readings((7.0, 6.9), ([7.01], [6.95]), [6.97], 0.02)
    assert set(readings) == {"best_trials", "seed_reruns", "shared_arm"}
    assert readings["shared_arm"]["value"] == pytest.approx(0.03)
