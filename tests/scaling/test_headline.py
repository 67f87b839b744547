"""`headline_lines`: the text a study report prints from a fit document."""

from __future__ import annotations

from k3scale.scaling.headline import headline_lines


def frontier_doc(last_value: float | None, last_ci: list | None) -> dict:
    points = [
        {"group": "k3", "compute": 1e10, "value": 0.5, "ci": [0.25, 1.5], "extrapolated": False},
        {"group": "k3", "compute": 3e10, "value": 0.8, "ci": [0.5, 2.0], "extrapolated": False},
        {"group": "k3", "compute": 1e11, "value": last_value, "ci": last_ci, "extrapolated": True},
    ]
    shared = {"multiplier": 0.6, "ci": [0.1, None], "p_value": 0.5, "rejected": False}
    frontiers = {"c_6n": {"baseline": "k2", "multiplier": points, "shared_exponent": shared}}
    return {"results": {"frontiers": frontiers}}


def test_multipliers_print_with_their_intervals():
    lines = headline_lines(frontier_doc(1.25, [0.5, 3.0]))
    assert lines[0] == "compute multiplier k3 over k2 (c_6n) at C=1e+10: 0.5 [0.25, 1.5]"
    assert lines[2] == (
        "compute multiplier k3 over k2 (c_6n) at C=1e+11: 1.25 [0.5, 3] (extrapolated)"
    )
    assert lines[3] == (
        "shared exponent (c_6n): p = 0.5, not rejected; single multiplier 0.6 [0.1, undefined]"
    )


def test_an_undefined_multiplier_is_named_not_a_crash():
    """Fits write NaN as null: M(C) is undefined where the new arm's loss at C lies below the
    baseline's fitted floor (a demo run hit this and the report crashed)."""
    lines = headline_lines(frontier_doc(None, [1e-25, None]))
    assert lines[2] == (
        "compute multiplier k3 over k2 (c_6n) at C=1e+11: undefined [1e-25, undefined] "
        "(extrapolated) (the baseline's fitted floor lies above k3's loss here)"
    )
