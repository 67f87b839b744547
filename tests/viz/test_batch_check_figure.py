"""The batch check's figure: every batch's trials, re-runs, fitted quadratic and optimum."""

from __future__ import annotations

import numpy as np

from k3scale.scaling.batch_check import compare_batches
from k3scale.scaling.study import StudyOptions
from k3scale.viz.batch_check import batch_check_panel
from tests.scaling.test_batch_check import TRUTH, synthetic_check


def test_the_figure_draws_each_batch_and_states_the_bound_in_its_caption():
    runs = synthetic_check(TRUTH, np.random.default_rng(1))
    result = compare_batches(runs, 7, StudyOptions(num_resamples=500))
    panel = batch_check_panel(runs, result)
    names = [trace.name for trace in panel.figure.data]
    for row in result["batches"]:
        label = f"batch {row['batch_size']} ({row['steps']} steps)"
        assert {label, f"{label}: re-runs", f"{label}: fitted optimum"} <= set(names)
        (optimum,) = [t for t in panel.figure.data if t.name == f"{label}: fitted optimum"]
        assert optimum.x == (row["optimum_lr"],) and optimum.y == (row["optimum_loss"],)
        (curve,) = [t for t in panel.figure.data if t.name == f"{label}: fitted quadratic"]
        # The dashed curve passes through the fitted optimum's loss at its LR.
        assert min(curve.y) <= row["optimum_loss"] + 1e-3
    bound = max(gain["nats"] for gain in result["largest_gain"].values())
    assert f"by at most {bound:.3f} nats" in panel.caption
