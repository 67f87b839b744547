"""analysis/README.md's "What these results can and cannot say about the K3 report", held to the
committed fits sentence by sentence (issue 47 item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3scale.scaling.values.fitdoc import read_comparisons, read_schedule_comparison

RESULTS = Path(__file__).resolve().parents[2] / "analysis" / "results"


def _results(folder: str) -> dict:
    return json.loads((RESULTS / folder / "fit.json").read_text())["results"]


@pytest.mark.parametrize("folder", ["cosine_vs_wsd-cpu_v3", "cosine_vs_wsd-cpu_v2"])
def test_no_schedule_study_admits_cosine_lower_by_the_report_s_002(folder):
    pooled = read_schedule_comparison(_results(folder)).pooled["wsd"]
    free = pooled.selection_free
    assert free is not None and free.identified
    assert free.interval[0] > -0.02


def test_v3_cannot_tell_the_schedules_apart_and_v2_lies_on_wsd_s_side():
    v3 = read_schedule_comparison(_results("cosine_vs_wsd-cpu_v3")).pooled["wsd"]
    lo, hi = v3.selection_free.interval
    assert lo < 0 < hi
    assert v3.pair_signs["wsd lower"] > v3.pair_signs["cosine lower"]
    assert v3.mean.value > v3.selection_free.value  # the tuning seed favoured WSD
    v2 = read_schedule_comparison(_results("cosine_vs_wsd-cpu_v2")).pooled["wsd"]
    assert v2.selection_free.interval[0] > 0


def _k2_route(folder: str, route: str):
    return read_comparisons(_results(folder))["c_6n"].routes[route]


def test_v3_refuses_every_law_for_k2_and_reads_m_by_the_monotone_route_alone():
    law = _k2_route("k2_vs_k3-cpu_v3", "envelope").arms["k2"].law
    assert "sits on an end of its search grid" in law.verdict.reason and law.params["E"] < -20
    pinned = _k2_route("k2_vs_k3-cpu_v3", "envelope_e0").arms["k2"].law
    assert "misses its Pareto points beyond their noise" in pinned.verdict.reason
    surface = _k2_route("k2_vs_k3-cpu_v3", "surface").arms["k2"].surface
    assert not surface.verdict.identified
    monotone = _k2_route("k2_vs_k3-cpu_v3", "monotone")
    m = [e for e in monotone.multiplier["k3"] if e.identified]
    assert sum(e.interval[0] > 1 for e in m) > len(m) / 2  # K3 ahead at most computes read
    above = [e.interval[0] for e in m if e.interval[0] > 1]
    assert (f"{min(above):.1f}", f"{max(above):.1f}") == ("1.1", "1.6")  # "from 1.1 to 1.6"
    compute = read_comparisons(_results("k2_vs_k3-cpu_v3"))["c_6n"].compute
    mid = monotone.multiplier["k3"][len(compute) // 2]
    assert compute[len(compute) // 2] == pytest.approx(2.52e11, rel=0.01)  # mid-overlap
    assert mid.identified and mid.interval[0] < 1 < mid.interval[1]  # "the bound holds 1"
    lo, hi = monotone.rate["k3"].interval
    assert lo < 0 < hi  # no trend


def test_v2_reads_the_same_way():
    assert not _k2_route("k2_vs_k3-cpu_v2", "envelope").arms["k2"].law.verdict.identified
    assert _k2_route("k2_vs_k3-cpu_v2", "surface").skipped
    lo, hi = _k2_route("k2_vs_k3-cpu_v2", "monotone").rate["k3"].interval
    assert lo < 0 < hi


def test_the_routes_calibration_reads_as_the_readme_says():
    """'The routes simulated on the v3 design': laws refused everywhere, the monotone M(C) bound
    covering the truth everywhere and never excluding 1 under no effect, at a fifth's power
    against 2.5x; its rate calibrated under no effect only."""
    calibration = json.loads((RESULTS / "calibration" / "k2_vs_k3-cpu_v3.json").read_text())
    worlds = calibration["scenarios"]["k2_vs_k3"]
    identified = [w["M_monotone_c_6n"]["identified_rate"] for w in worlds.values()]
    assert (round(min(identified), 3), max(identified)) == (0.925, 1.0)  # "0.925-1.00"
    for world in worlds.values():
        assert world["M_envelope_c_6n"]["identified_rate"] == 0.0
        assert world["M_envelope_e0_c_6n"]["identified_rate"] == 0.0
        assert world["M_monotone_c_6n"]["coverage_vs_design"] == 1.0  # "in every ... study"
    for null in ("no_effect", "no_effect_curved"):
        m, rate = worlds[null]["M_monotone_c_6n"], worlds[null]["rate_monotone_c_6n"]
        assert m["detect_rate"] == 0.0  # "excludes M = 1 in none"
        # 120 studies per world: each rate carries a standard error of about 0.02.
        assert rate["detect_rate"] <= 0.07 and rate["coverage_vs_design"] >= 0.92
        assert 0.925 <= rate["coverage_vs_design"] <= 0.955  # "93-95%"
    power = (
        worlds["report_direction"]["M_monotone_c_6n"]["detect_rate"],
        worlds["report_direction_curved"]["M_monotone_c_6n"]["detect_rate"],
        worlds["opposite"]["M_monotone_c_6n"]["detect_rate"],
    )
    assert [f"{p:.2f}" for p in power] == ["0.21", "0.15", "0.95"]
    # The rate's coverage of the truth's rate where there is an effect: "0.84 ... 0.20 ... 0.04".
    held = [
        worlds[w]["rate_monotone_c_6n"]["coverage_vs_design"]
        for w in ("report_direction", "opposite", "report_direction_curved")
    ]
    assert [f"{c:.2f}" for c in held] == ["0.84", "0.20", "0.04"]
