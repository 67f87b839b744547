"""An ablation's report lines: where each interval puts the published anchor (issue 38: say
plainly where a tiny-model result agrees, disagrees or cannot tell)."""

from __future__ import annotations

import pytest

from k3scale.scaling.component_text import anchor_reading
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.scaling.values.verdict import Verdict


def _multiplier(lo: float, hi: float) -> Estimate:
    return Estimate((lo * hi) ** 0.5, [lo, hi], Verdict(None))


@pytest.mark.parametrize(
    ("lo", "hi", "reading"),
    [
        (1.05, 1.30, "agrees"),
        (0.95, 1.30, "cannot tell (holds 1 and 1.16x)"),
        (0.90, 1.10, "disagrees: below 1.16x"),
        (1.20, 1.50, "disagrees: above 1.16x"),
    ],
)
def test_the_interval_agrees_disagrees_or_cannot_tell(lo, hi, reading):
    assert anchor_reading(_multiplier(lo, hi), 1.16) == reading


def test_no_anchor_and_no_interval_say_so():
    assert anchor_reading(_multiplier(0.9, 1.1), None) == "-"
    unidentified = Estimate(None, None, Verdict("too few cells"))
    assert anchor_reading(unidentified, 1.25) == "cannot tell (not identified)"
