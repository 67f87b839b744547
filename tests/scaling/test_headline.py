"""`headline_lines` and `markdown_tables`: what a study report prints from a fit document."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from k3scale.scaling.headline import headline_lines, markdown_tables
from k3scale.scaling.values.fitdoc import (
    ArmFrontier,
    CellDifference,
    CellOptimumRecord,
    Comparison,
    Curve,
    PooledDifference,
    Route,
    ScheduleComparison,
)
from k3scale.scaling.values.result import dumps
from k3scale.scaling.values.text import ratio_text
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.scaling.values.verdict import Verdict

OK = Verdict()
CURVE = Curve((1e10, 1e11), (3.0, 2.9), (2.9, 2.8), (3.1, 3.0))


def multiplier_doc(points: list[Estimate], rate: Estimate | None = None) -> dict:
    """A fit document whose surface route holds `points` (and `rate`) and whose envelope route
    was skipped."""
    rates = {"k3": rate} if rate else {}
    route = Route({"k2": ArmFrontier(CURVE), "k3": ArmFrontier(CURVE)}, {"k3": points}, rates)
    routes = {"surface": route, "envelope": Route({}, {}, skipped="k2: 1 identified cell")}
    conv = Comparison("k2", tuple(np.geomspace(1e10, 1e11, len(points)).tolist()), routes)
    skipped = Comparison("k2", skipped="no arms")
    return {"results": {"compute_optimal": {"c_6n": conv.to_json(), "c_attn": skipped.to_json()}}}


def test_identified_multipliers_print_with_their_intervals():
    points = [
        Estimate(2.5, [2.0, 3.1], OK),
        Estimate(2.46, [2.01, 3.0], OK),
        Estimate(None, None, Verdict("M(C) undefined at this compute")),
    ]
    lines = headline_lines(multiplier_doc(points))
    assert "compute multiplier (c_attn): not identified (no arms)" in lines
    assert "compute multiplier (c_6n, envelope): not identified (k2: 1 identified cell)" in lines
    assert "compute multiplier k3 over k2 (c_6n, surface route) at C=1e+10: 2.5 [2, 3.1]" in lines
    assert (
        "compute multiplier k3 over k2 (c_6n, surface route) at C=1e+11: "
        "not identified (M(C) undefined at this compute)"
    ) in lines


def test_the_rate_says_where_its_interval_lies_and_claims_no_trend():
    points = [Estimate(3.0 - i / 4, [2.5 - i / 4, 3.5 - i / 4], OK) for i in range(5)]
    shrinks = Estimate(-0.4, [-0.6, -0.2], OK)
    lines = headline_lines(multiplier_doc(points, shrinks))
    assert (
        "rate of M(C) k3 over k2 (c_6n, surface route), d log M / d log C: -0.400 "
        "[-0.600, -0.200] (its interval lies below 0)"
    ) in lines
    held = headline_lines(multiplier_doc(points, Estimate(0.1, [-0.1, 0.3], OK)))
    assert any("(its interval holds 0)" in line for line in held)
    assert not any("with compute" in line for line in lines + held)
    table = markdown_tables(multiplier_doc(points, shrinks))
    # Every compute value of the overlap, not only its ends and middle.
    assert table.count("| c_6n | surface |") == 5
    assert "Rate of M(C) k3 over k2 (c_6n, surface route)" in table


def test_a_number_that_is_not_identified_is_never_printed():
    """The verdict alone, however narrow the interval: a refused number beside its reason
    reads as a result (issue 51)."""
    wide = ratio_text(
        Estimate(0.15, [7.56e-13, 9.95e56], Verdict("M(C) interval spans 69 decades"))
    )
    assert wide == "not identified (M(C) interval spans 69 decades)"
    narrow = ratio_text(
        Estimate(2.0, [0.5, 20.0], Verdict("M(C) interval spans 1.6 decades (> 1)"))
    )
    assert narrow == "not identified (M(C) interval spans 1.6 decades (> 1))"
    assert ratio_text(Estimate(2.0, [1.5, 2.5], OK)) == "2 [1.5, 2.5]"


def schedule_doc(pooled: PooledDifference | None = None) -> dict:
    where = {"arch": "k3", "size": "k3-t1", "budget_tokens": 49152}
    difference = CellDifference(
        cell=where,
        reference="cosine",
        other="wsd",
        own=Estimate(-0.0123, [-0.02, -0.004], OK),
        shared=Estimate(None, None, Verdict("the other schedule never ran the reference's batch")),
        lr_ratio=0.8,
        batch_ratio=1.0,
        losses={"cosine": 6.5, "wsd": 6.5123},
    )
    pooled = pooled or PooledDifference(1, 0, 0, Estimate(None, None, Verdict("1 cluster(s)")))
    noise = {"sd": 0.021, "method": "pooled", "quadratic_residual_sd": 0.02, "seed_sd": 0.022}
    comparison = ScheduleComparison("cosine", [difference], {"wsd": pooled}, noise)
    optimum = CellOptimumRecord(
        cell={**where, "schedule": "cosine"},
        n=142295.0,
        tokens=49152.0,
        compute={"c_6n": 4.2e10},
        loss=Estimate(6.5, [6.49, 6.52], OK),
        lr_opt=0.01,
        batch_opt=2048.0,
        mode="1d",
        trials=7,
        best_trial={"lr": 0.01, "batch": 2048.0, "loss": 6.51, "run_id": "r1"},
        seed_losses=[],
    )
    results = {"schedule_comparison": comparison, "cell_optima": [optimum]}
    return json.loads(dumps({"results": results}))


def test_schedule_lines_state_the_sign_and_the_verdicts():
    lines = headline_lines(schedule_doc())
    assert "negative: cosine lower" in lines[0]
    assert lines[1] == "  pooled over cells (wsd): not identified (1 cluster(s))"
    assert lines[2] == (
        "  k3-t1 D=49,152: own optima -0.012 [-0.020, -0.004]; at cosine's optimum "
        "not identified (the other schedule never ran the reference's batch)"
    )


def test_markdown_tables_carry_the_same_numbers():
    text = markdown_tables(schedule_doc())
    assert (
        "| k3 | cosine | k3-t1 | 49,152 | 7 | 1d | 6.500 [6.490, 6.520] | 6.510 | identified |"
        in text
    )
    assert "Cell optima identified: 1 of 1." in text
    assert "| k3-t1 | 49,152 | -0.012 [-0.020, -0.004] | not identified" in text


def test_the_reruns_off_the_tuning_seed_are_signed_and_the_pooled_mean_is_context():
    pooled = PooledDifference(
        6,
        6,
        3,
        Estimate(0.011, [-0.002, 0.022], OK),
        point_signs={"cosine lower": 1, "wsd lower": 5},
        selection_free=Estimate(-0.006, [-0.010, -0.002], OK),
        pairs=12,
        pair_cells=6,
        pair_signs={"cosine lower": 9, "wsd lower": 3},
    )
    lines = headline_lines(schedule_doc(pooled))
    assert lines[1] == (
        "  signed, on the re-runs that did not choose the points (wsd; 12 pairs at matched seeds "
        "in 6 cells), since the tuning seed chose the points and its differences carry the "
        "selection's luck: mean -0.006 [-0.010, -0.002] (cosine lower by 0.002 to 0.010); "
        "pair signs: cosine lower 9, wsd lower 3"
    )
    assert lines[2].startswith(
        "  context, all seeds pooled over 6 of 6 cells (wsd): mean +0.011 [-0.002, +0.022] "
        "(not resolved: the interval holds 0, from cosine lower by 0.002 to wsd lower by 0.022)"
    )
    text = markdown_tables(schedule_doc(pooled))
    assert "\n\nSigned, on the re-runs that did not choose the points (wsd; 12 pairs" in text
    assert "\n\nContext, all seeds pooled over 6 of 6 cells (wsd): +0.011" in text
    # Without a t-interval the re-runs say why, and the all-seeds mean is the one signed.
    few = dataclasses.replace(pooled, selection_free=Estimate(0.01, None, Verdict("2 pairs")))
    lines = headline_lines(schedule_doc(few))
    assert (
        lines[1]
        == "  on the re-runs that did not choose the points (wsd): not identified (2 pairs)"
    )
    assert lines[2].startswith("  signed, all seeds pooled over 6 of 6 cells (wsd)")
