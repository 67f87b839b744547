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
    assert sum(e.interval[0] > 1 for e in m) > len(m) / 2  # K3 ahead across most of the overlap
    lo, hi = monotone.rate["k3"].interval
    assert lo < 0 < hi  # no trend


def test_v2_reads_the_same_way():
    assert not _k2_route("k2_vs_k3-cpu_v2", "envelope").arms["k2"].law.verdict.identified
    assert _k2_route("k2_vs_k3-cpu_v2", "surface").skipped
    lo, hi = _k2_route("k2_vs_k3-cpu_v2", "monotone").rate["k3"].interval
    assert lo < 0 < hi


def test_the_routes_calibration_reads_as_the_readme_says():
    """'The routes simulated on the v3 design': laws refused everywhere, the monotone M failing
    its calibration, its rate calibrated."""
    calibration = json.loads((RESULTS / "calibration" / "k2_vs_k3-cpu_v3.json").read_text())
    worlds = calibration["scenarios"]["k2_vs_k3"]
    for world in worlds.values():
        assert world["M_envelope_c_6n"]["identified_rate"] == 0.0
        assert world["M_envelope_e0_c_6n"]["identified_rate"] == 0.0
        assert world["M_monotone_c_6n"]["identified_rate"] == 1.0
    for null in ("no_effect", "no_effect_curved"):
        m, rate = worlds[null]["M_monotone_c_6n"], worlds[null]["rate_monotone_c_6n"]
        assert 0.15 < m["detect_rate"] < 0.30  # about a fifth, far above 5%
        assert m["coverage"] > 0.93 and m["coverage_vs_design"] < 0.85
        # 120 studies per world: each rate carries a standard error of about 0.02.
        assert rate["detect_rate"] <= 0.07 and rate["coverage_vs_design"] >= 0.92
