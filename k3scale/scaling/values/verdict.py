"""Identification verdicts: whether a fitted quantity says something, and if not, why.

Every headline quantity in a fit artifact carries `"verdict": "identified"` or
`"not identified: <reason>"` (methods.md 2.6, 4.7). The rules live here so the CLI report, the
dashboards and the calibration bench read one definition.
"""

from __future__ import annotations

import dataclasses
import math

IDENTIFIED = "identified"
# Scaling exponents outside this open interval are not physical at these scales (a loss that
# does not fall, or one that vanishes within a decade); a fit that lands there is not a success.
EXPONENT_BOUNDS = (0.05, 2.0)
# A compute multiplier whose 95% interval spans more than this many decades says nothing
# (methods.md 2.6); a multiplier that is not identified prints its reason, never its number.
MULTIPLIER_DECADES = 1.0


NOT_IDENTIFIED_PREFIX = "not identified: "


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a quantity is identified; if not, the reason (None when identified).

    In a fit artifact it is the text "identified" or "not identified: <reason>"; `from_json` is
    the one place that text is read back.
    """

    reason: str | None = None

    @property
    def identified(self) -> bool:
        return self.reason is None

    def to_json(self) -> str:
        return IDENTIFIED if self.reason is None else f"{NOT_IDENTIFIED_PREFIX}{self.reason}"

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        if text == IDENTIFIED:
            return cls()
        if not isinstance(text, str) or not text.startswith(NOT_IDENTIFIED_PREFIX):
            raise ValueError(f"not a verdict: {text!r}")
        return cls(text.removeprefix(NOT_IDENTIFIED_PREFIX))

    @classmethod
    def first(cls, *reasons: str | None) -> Verdict:
        """The verdict from candidate reasons in order (None = that check passed)."""
        return cls(next((r for r in reasons if r), None))


def not_identified(reason: str) -> str:
    return f"not identified: {reason}"


def is_identified(verdict: str | None) -> bool:
    return verdict == IDENTIFIED


def exponent_reason(name: str, value: float, interval: list[float] | None = None) -> str | None:
    """Why an exponent is not identified: outside EXPONENT_BOUNDS, or its interval leaves them."""
    lo, hi = EXPONENT_BOUNDS
    if not math.isfinite(value) or not lo < value < hi:
        return f"{name} = {value:.3g} outside ({lo}, {hi})"
    if interval is not None:
        a, b = interval
        if a is None or b is None or not (lo < a and b < hi):
            return f"{name} interval {_pair(interval)} leaves ({lo}, {hi})"
    return None


# Share of draws in which a quantity must be defined (no extrapolation) to be identified.
MIN_DEFINED = 0.9


def defined_share_reason(name: str, share: float) -> str | None:
    """Why a quantity defined in only `share` of its draws is not identified: its interval would
    be read from the draws that happen to define it."""
    if share >= MIN_DEFINED:
        return None
    return f"{name} defined in only {share:.0%} of draws (extrapolates in the rest)"


def ratio_reason(name: str, interval: list[float] | None, decades: float) -> str | None:
    """Why a positive ratio (a multiplier) is not identified: no interval, or one too wide."""
    if not interval or interval[0] is None or interval[1] is None:
        return f"{name} has no interval"
    lo, hi = interval
    if lo <= 0 or not math.isfinite(hi):
        return f"{name} interval {_pair(interval)} is not bounded away from 0 and infinity"
    width = math.log10(hi / lo)
    if width > decades:
        return f"{name} interval spans {width:.1f} decades (> {decades:g})"
    return None


def _pair(interval) -> str:
    return "[" + ", ".join("undefined" if v is None else f"{v:.3g}" for v in interval) + "]"
