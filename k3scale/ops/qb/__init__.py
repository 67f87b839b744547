"""Quantile Balancing (architecture.md section 7): the exact sort-based update (`naive.py`) and
the histogram estimator the model uses (`histogram.py`, one all-reduce of integer counts)."""

from k3scale.ops.qb.histogram import (
    margin_counts,
    margin_range,
    qb_bias_histogram,
    qb_threshold_histogram,
)
from k3scale.ops.qb.naive import (
    centre,
    qb_bias_exact,
    qb_margins,
    qb_threshold_exact,
    route_with_cutoff,
)

__all__ = [
    "centre",
    "margin_counts",
    "margin_range",
    "qb_bias_exact",
    "qb_bias_histogram",
    "qb_margins",
    "qb_threshold_exact",
    "qb_threshold_histogram",
    "route_with_cutoff",
]
