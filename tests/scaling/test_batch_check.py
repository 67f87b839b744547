"""The batch sensitivity check's estimator, checked by simulation on cells with a known truth."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from k3scale.errors import K3ScaleError
from k3scale.scaling.batch_check import compare_batches, verdict_sentence
from k3scale.scaling.study import StudyOptions

SEQ = 256
RATIO = 1.6
# Loss rises by CURVATURE * (log LR distance)^2 from a batch's optimum: 0.027 nats one grid step
# (x1.6) away, about what the committed k3-s1 cell shows; NOISE is its measured seed sd.
CURVATURE = 0.12
NOISE = 0.02


def synthetic_check(
    truth: dict[int, tuple[float, float]], rng, reference_lr=1.5e-2
) -> pl.DataFrame:
    """A check's run table: per batch size, 4 grid LRs 1.6x apart around `reference_lr` (seed 0)
    and 2 re-runs at the best of them. truth: batch -> (optimum loss, optimum LR)."""
    rows = []
    for batch, (best_loss, best_lr) in truth.items():
        budget = 600_000 // (batch * SEQ) * batch * SEQ
        grid = reference_lr * RATIO ** (np.arange(4) - 1.5)

        def loss_at(lr, best_loss=best_loss, best_lr=best_lr):
            return best_loss + CURVATURE * np.log(lr / best_lr) ** 2 + rng.normal(0, NOISE)

        tuned = [(lr, loss_at(lr), "tuned", 0) for lr in grid]
        best = min(tuned, key=lambda r: r[1])[0]
        reruns = [(best, loss_at(best), "seed", seed) for seed in (1, 2)]
        for i, (lr, loss, arm, seed) in enumerate(tuned + reruns):
            rows.append(
                {
                    "run_id": f"b{batch:02d}-{i}",
                    "status": "finished",
                    "arm": arm,
                    "arch": "k3",
                    "schedule": "wsd",
                    "size": "k3-s1",
                    "budget_tokens": budget,
                    "batch_size": batch,
                    "batch_tokens": batch * SEQ,
                    "seed": seed,
                    "lr": float(lr),
                    "tokens": budget,
                    "n_active": 30_000,
                    "c_6n": 6.0 * 30_000 * budget,
                    "c_attn": 16.0 * 30_000 * budget,
                    "git_sha": "a" * 40,
                    "final_val_ood_loss": float(loss),
                }
            )
    return pl.DataFrame(rows)


TRUTH = {4: (4.19, 1.0e-2), 7: (4.20, 1.3e-2), 12: (4.24, 1.7e-2)}


def test_the_difference_intervals_cover_the_true_batch_effect():
    """Coverage of the 95% intervals of (batch b's optimum - batch 7's), over simulated checks
    with optima inside the grid. 200 checks: a nominal 95% gives 190 +- 3; an estimator that
    ignored its noise would cover almost never."""
    rng = np.random.default_rng(20)
    covered = {4: 0, 12: 0}
    checks = 200
    for i in range(checks):
        options = StudyOptions(num_resamples=400, seed=i)
        result = compare_batches(synthetic_check(TRUTH, rng), 7, options)
        for row in result["batches"]:
            if row["batch_size"] == 7:
                continue
            lo, hi = row["optimum_minus_reference"]["interval"]
            covered[row["batch_size"]] += lo <= TRUTH[row["batch_size"]][0] - TRUTH[7][0] <= hi
    for batch, hits in covered.items():
        assert hits / checks >= 0.9, f"batch {batch}: {hits}/{checks} intervals cover the truth"


def test_a_clearly_better_batch_is_found_and_its_gain_bounded():
    rng = np.random.default_rng(3)
    truth = {4: (4.10, 1.0e-2), 7: (4.20, 1.3e-2), 12: (4.24, 1.7e-2)}
    result = compare_batches(synthetic_check(truth, rng), 7, StudyOptions(num_resamples=2000))
    by_batch = {row["batch_size"]: row for row in result["batches"]}
    lo, hi = by_batch[4]["optimum_minus_reference"]["interval"]
    assert hi < 0 < -lo
    fitted = result["largest_gain"]["optimum_minus_reference"]
    assert fitted["batch_size"] == 4 and fitted["nats"] == pytest.approx(-lo)
    assert "By the fitted optima, batch 4 beats batch 7 beyond the noise" in verdict_sentence(
        result
    )
    assert by_batch[7]["optimum_minus_reference"] == {"value": 0.0, "interval": [0.0, 0.0]}
    assert [row["steps"] for row in result["batches"]] == [585, 334, 195]
    # The re-runs' difference: its own t interval around the means' difference.
    mean = by_batch[4]["rerun_mean_minus_reference"]
    assert mean["interval"][0] < mean["value"] < mean["interval"][1]
    assert mean["value"] == pytest.approx(by_batch[4]["rerun_mean"] - by_batch[7]["rerun_mean"])


def test_runs_that_are_not_one_cell_per_batch_are_refused():
    rng = np.random.default_rng(0)
    table = synthetic_check(TRUTH, rng)
    with pytest.raises(K3ScaleError, match="no runs at the reference batch 8"):
        compare_batches(table, 8, StudyOptions(num_resamples=10))
    two_sizes = table.with_columns(
        pl.when(pl.col("batch_size") == 4).then(pl.lit("k3-s2")).otherwise("size").alias("size")
    )
    with pytest.raises(K3ScaleError, match="one model size under one schedule"):
        compare_batches(two_sizes, 7, StudyOptions(num_resamples=10))
