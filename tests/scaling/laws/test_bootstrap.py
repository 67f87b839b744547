"""Bootstrap draws: their percentile intervals keep the shape every fit reports."""

from __future__ import annotations

import numpy as np
import pytest

from k3scale.scaling.laws.bootstrap import BootstrapDraws


def test_intervals_read_any_number_of_finite_refits_and_nan_where_none():
    values = np.full((40, 3), np.nan)
    values[:, 0] = np.arange(40.0)
    values[7, 1] = 2.5  # one finite refit in 40
    intervals = BootstrapDraws(("many", "one", "none"), values, seed=0, unit="points").intervals()
    assert intervals["many"] == pytest.approx(np.percentile(np.arange(40.0), [2.5, 97.5]))
    assert intervals["one"] == [2.5, 2.5]
    assert np.isnan(intervals["none"]).all() and len(intervals["none"]) == 2
