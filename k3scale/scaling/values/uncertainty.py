"""Intervals and estimates: the one percentile interval, and a value with its interval and verdict.

Every interval in a fit artifact is a percentile interval over draws (bootstrap refits, or draws
of the cell optima's sampling distribution) read by `percentile_interval`, except the pooled
t-interval over independent clusters of cells (k3scale/scaling/estimates/schedule_compare.py)
and the rate of M(C), which takes the hull of its percentile interval and
`robust_normal_interval` (k3scale/scaling/estimates/compute_optimal.py `rate_interval`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.stats import norm

from k3scale.scaling.values.verdict import Verdict

LEVEL = 0.95
# A 95% percentile interval is read from at least this many finite draws: with fewer, its
# 2.5% tail is the smallest draw or worse.
MIN_INTERVAL_DRAWS = 20


def percentile_interval(
    draws, level: float = LEVEL, min_draws: int = MIN_INTERVAL_DRAWS
) -> list[float] | None:
    """[lo, hi] central percentile interval over the finite draws; None with too few of them."""
    values = np.asarray(draws, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    if len(finite) < max(min_draws, 1):
        return None
    tail = 100 * (1 - level) / 2
    return np.percentile(finite, [tail, 100 - tail]).tolist()


def robust_sd(draws, min_draws: int = MIN_INTERVAL_DRAWS) -> float | None:
    """Half the finite draws' central 68%: their standard deviation where they are normal, and
    one that a few wild draws cannot inflate; None with too few of them."""
    values = np.asarray(draws, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    if len(finite) < max(min_draws, 1):
        return None
    lo, hi = np.percentile(finite, [100 * norm.cdf(-1), 100 * norm.cdf(1)])
    return float(hi - lo) / 2


def robust_normal_interval(draws, point: float, level: float = LEVEL) -> list[float] | None:
    """point -/+ z * `robust_sd(draws)`; None without a finite point or enough draws."""
    sd = robust_sd(draws)
    if sd is None or not np.isfinite(point):
        return None
    half = norm.ppf(1 - (1 - level) / 2) * sd
    return [float(point - half), float(point + half)]


def percentile_band(curves: np.ndarray, level: float = LEVEL) -> dict[str, list[float]]:
    """{"lo": [g], "hi": [g]}: `percentile_interval` of every column of curves [S, g] (NaN where
    a column has too few finite draws)."""
    pairs = [percentile_interval(column, level) or [np.nan, np.nan] for column in curves.T]
    return {"lo": [float(p[0]) for p in pairs], "hi": [float(p[1]) for p in pairs]}


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A reported number: its point value, 95% interval and verdict.

    Attributes:
        value: point estimate (None where undefined).
        interval: [lo, hi] (None where no interval could be read).
        verdict: identified, or not and why.
        defined_share: share of draws in which the quantity was defined (None when every
            draw defines it by construction).
    """

    value: float | None
    interval: list[float] | None
    verdict: Verdict
    defined_share: float | None = None

    @property
    def identified(self) -> bool:
        return self.verdict.identified

    def to_json(self) -> dict:
        out = {"value": self.value, "ci": self.interval, "verdict": self.verdict.to_json()}
        if self.defined_share is not None:
            out["defined_share"] = self.defined_share
        return out

    @classmethod
    def from_json(cls, doc: dict) -> Estimate:
        return cls(
            value=doc.get("value"),
            interval=doc.get("ci"),
            verdict=Verdict.from_json(doc["verdict"]),
            defined_share=doc.get("defined_share"),
        )
