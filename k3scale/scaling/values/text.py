"""How a number, an interval and a verdict read in a report, a README table and a caption: one
text for each, so the places that print them agree (tests/viz/test_report_agreement.py)."""

from __future__ import annotations

import math

from k3scale.scaling.values.uncertainty import Estimate
from k3scale.scaling.values.verdict import Verdict


def number(value: float | None, digits: int = 3) -> str:
    """`value` to `digits` significant digits; None (NaN in the artifact) is 'undefined'."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "undefined"
    return f"{value:.{digits}g}"


def loss_diff(value: float | None) -> str:
    return "undefined" if value is None else f"{value:+.3f}"


def interval(ci: list | None, fmt=number) -> str:
    if not ci or ci[0] is None or ci[1] is None:
        return "[no interval]"
    return f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def ratio_text(e: Estimate) -> str:
    """A multiplier with its interval, or 'not identified (reason)' without the number: a value
    printed beside its refusal reads as a result and gets quoted (issue 51)."""
    if e.identified:
        return f"{number(e.value)} {interval(e.interval)}"
    return reason_text(e.verdict)


def diff_text(e: Estimate) -> str:
    if e.identified:
        return f"{loss_diff(e.value)} {interval(e.interval, loss_diff)}"
    return reason_text(e.verdict)


def reason_text(ruling: Verdict) -> str:
    return f"not identified ({ruling.reason})"


def verdict_text(ruling: Verdict) -> str:
    """'identified', or 'not identified (reason)' as the report prints it."""
    return "identified" if ruling.identified else reason_text(ruling)


def difference_says(e: Estimate, ref: str, other: str) -> str:
    """What an identified difference ref - other says, read forwards: which schedule is lower
    and by how much, or that the interval holds 0 and how far it reaches either way."""
    lo, hi = e.interval
    if hi < 0:
        return f"{ref} lower by {-hi:.3f} to {-lo:.3f}"
    if lo > 0:
        return f"{other} lower by {lo:.3f} to {hi:.3f}"
    return (
        f"not resolved: the interval holds 0, from {ref} lower by {-lo:.3f} to {other} lower "
        f"by {hi:.3f}"
    )
