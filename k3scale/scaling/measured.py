"""Schedule comparison from measured runs alone, beside the fitted one (methods.md 3.2).

Three paired readings per cell, each a difference of mean final losses, reference minus other:
* best trials: each schedule's best tuning trial (both biased low by the same selection);
* seed re-runs: each schedule's best point re-run with the other seeds (no selection bias);
* shared arm: the reference's best trial against the other schedule run at that same point.
Intervals come from the run-to-run noise at a fixed point, pooled over the study: every seed
re-run repeats a best trial, so their differences hold two runs' noise (sd / sqrt(2) per run;
their mean, the selection bias, is removed). Single runs at each end make these intervals wide
on purpose; they say what the measurements alone can resolve.
"""

from __future__ import annotations

import math

import numpy as np

Z_95 = 1.959964
MIN_NOISE_PAIRS = 3


def run_noise_sd(pairs: list[tuple[float, list[float]]]) -> dict:
    """Pooled per-run noise from (best trial loss, losses of its re-runs) pairs."""
    diffs = [rerun - best for best, reruns in pairs for rerun in reruns]
    sd = float(np.std(diffs, ddof=1) / math.sqrt(2)) if len(diffs) >= MIN_NOISE_PAIRS else None
    return {
        "sd": sd,
        "pairs": len(diffs),
        "mean_rerun_minus_best": float(np.mean(diffs)) if diffs else None,
        "method": "sd of (seed re-run - best trial at the same point) / sqrt(2)",
    }


def difference(reference: list[float], other: list[float], noise_sd: float | None) -> dict:
    """Mean(reference) - mean(other) with a 95% interval from the per-run noise."""
    value = float(np.mean(reference) - np.mean(other))
    entry = {"value": value, "runs": [len(reference), len(other)]}
    if noise_sd is not None:
        half = Z_95 * noise_sd * math.sqrt(1 / len(reference) + 1 / len(other))
        entry["ci"] = [value - half, value + half]
    return entry


def cell_readings(
    best: tuple[float, float],
    seeds: tuple[list[float], list[float]],
    shared: list[float],
    noise_sd: float | None,
) -> dict:
    """The three readings of one cell that its runs allow (reference first in each pair)."""
    readings = {"best_trials": difference([best[0]], [best[1]], noise_sd)}
    if seeds[0] and seeds[1]:
        readings["seed_reruns"] = difference(seeds[0], seeds[1], noise_sd)
    if shared:
        readings["shared_arm"] = difference([best[0]], shared, noise_sd)
    return readings
