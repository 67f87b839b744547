"""`headline_lines` and `markdown_tables`: what a study report prints from a fit document."""

from __future__ import annotations

from k3scale.scaling.headline import headline_lines, markdown_tables, ratio_text

OK = "identified"


def multiplier_doc(points: list[dict]) -> dict:
    route = {"multiplier": {"k3": points}}
    conv = {
        "baseline": "k2",
        "compute": [1e10, 3e10, 1e11],
        "routes": {"surface": route, "envelope": {"skipped": "k2: 1 identified cell"}},
        "agreement": {"k3": [{"status": "not comparable (a route is undefined here)"}] * 3},
    }
    return {"results": {"compute_optimal": {"c_6n": conv, "c_attn": {"skipped": "no arms"}}}}


def test_identified_multipliers_print_with_their_intervals():
    points = [
        {"value": 2.5, "ci": [2.0, 3.1], "verdict": OK},
        {"value": 2.46, "ci": [2.01, 3.0], "verdict": OK},
        {"value": None, "ci": None, "verdict": "not identified: M(C) undefined at this compute"},
    ]
    lines = headline_lines(multiplier_doc(points))
    assert "compute multiplier (c_attn): not identified (no arms)" in lines
    assert "compute multiplier (c_6n, envelope): not identified (k2: 1 identified cell)" in lines
    assert "compute multiplier k3 over k2 (c_6n, surface route) at C=1e+10: 2.5 [2, 3.1]" in lines
    assert (
        "compute multiplier k3 over k2 (c_6n, surface route) at C=1e+11: "
        "not identified (M(C) undefined at this compute)"
    ) in lines


def test_a_wide_interval_is_never_printed():
    """More than two decades: the verdict alone; within two, the numbers beside the verdict."""
    wide = ratio_text(0.15, [7.56e-13, 9.95e56], "not identified: M(C) interval spans 69 decades")
    assert wide == "not identified (M(C) interval spans 69 decades)"
    narrow = ratio_text(2.0, [0.5, 20.0], "not identified: M(C) interval spans 1.6 decades (> 1)")
    assert narrow == "2 [0.5, 20], not identified (M(C) interval spans 1.6 decades (> 1))"


def schedule_doc() -> dict:
    own = {
        "diff_own": -0.0123,
        "ci_own": [-0.02, -0.004],
        "verdict_own": OK,
        "sign_own": "cosine lower",
        "diff_shared": None,
        "ci_shared": None,
        "verdict_shared": "not identified: the other schedule never ran the reference's batch",
        "lr_ratio": 0.8,
    }
    cell = {"cell": {"arch": "k3", "size": "k3-t1", "budget_tokens": 49152}, "comparison": {}}
    cell["comparison"]["wsd"] = own
    pooled = {"wsd": {"verdict": "not identified: 1 cluster(s)", "cells": 1}}
    noise = {"sd": 0.021, "method": "pooled", "quadratic_residual_sd": 0.02, "seed_sd": 0.022}
    comparison = {"reference": "cosine", "cells": [cell], "pooled": pooled, "run_noise": noise}
    optimum = {
        "cell": {**cell["cell"], "schedule": "cosine"},
        "optimum": {"trials": 7, "mode": "1d"},
        "loss": 6.5,
        "loss_ci": [6.49, 6.52],
        "verdict": OK,
        "best_trial": {"loss": 6.51},
    }
    return {"results": {"schedule_comparison": comparison, "cell_optima": [optimum]}}


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
