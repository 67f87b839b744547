"""The power line a report prints beside its answers says plainly when the preset's design
cannot answer, or is too weak to settle it (issue 51), read off committed calibrations."""

from __future__ import annotations

import json
from pathlib import Path

from k3scale.bench import power

CALIBRATION = Path(__file__).resolve().parents[2] / "analysis" / "results" / "calibration"


def _power(name: str, study: str) -> str:
    return power.power_line(json.loads((CALIBRATION / name).read_text()), study)


def test_a_design_that_identifies_nothing_says_it_cannot_answer():
    line = _power("demo.json", "k2_vs_k3")
    assert "this design cannot answer it" in line and "detects" not in line
    assert power.design_power("k2_vs_k3", "demo") == line


def test_a_weak_design_says_its_answer_is_no_evidence():
    line = _power("demo.json", "cosine_vs_wsd")
    assert "detects cosine lower by 0.02 nats in 2%" in line
    assert "too weak to settle it" in line


def test_a_design_with_power_says_nothing_more():
    line = _power("cpu_v3.json", "cosine_vs_wsd")
    worlds = json.loads((CALIBRATION / "cpu_v3.json").read_text())["scenarios"]["cosine_vs_wsd"]
    assert worlds["report_direction"]["pooled_diff"]["detect_rate"] >= 0.5
    assert "too weak" not in line and "cannot answer" not in line
