"""One sentence per claim: the numbers are the artifact's, and the words say what the interval
excludes on each side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3scale.scaling.answers import answer_lines, difference_answer, multiplier_answers
from k3scale.scaling.values.fitdoc import PooledDifference, read_comparisons
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.scaling.values.verdict import Verdict

RESULTS = Path(__file__).resolve().parents[2] / "analysis" / "results"


def _pooled(value, lo, hi) -> PooledDifference:
    return PooledDifference(6, 6, 3, Estimate(value, [lo, hi], Verdict()))


@pytest.mark.parametrize(
    ("interval", "says"),
    [
        ((-0.03, -0.01), "cosine lower, by 0.010 to 0.030 nats; it excludes no difference"),
        ((0.001, 0.021), "wsd lower, by 0.001 to 0.021 nats; it excludes no difference"),
        (
            (-0.017, 0.021),
            "not resolved; it excludes cosine lower by more than 0.017 nats and wsd lower by "
            "more than 0.021",
        ),
    ],
)
def test_a_difference_says_what_its_interval_excludes(interval, says):
    line = difference_answer(_pooled(sum(interval) / 2, *interval), "cosine", "wsd")
    assert says in line
    assert f"[{interval[0]:+.3f}, {interval[1]:+.3f}] nats" in line


def test_an_unidentified_difference_says_why():
    p = PooledDifference(6, 1, 1, Estimate(None, None, Verdict("1 identified cell")))
    assert difference_answer(p, "cosine", "wsd").endswith("not identified (1 identified cell)")


def test_the_committed_schedule_study_answers_with_its_stored_pooled_difference():
    doc = json.loads((RESULTS / "cosine_vs_wsd-cpu_v2" / "fit.json").read_text())
    pooled = doc["results"]["schedule_comparison"]["pooled"]["wsd"]
    (line,) = answer_lines(doc)
    lo, hi = pooled["ci"]
    assert f"{pooled['mean_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] nats" in line
    check = pooled["across_sizes"]["ci"]
    assert f"[{check[0]:+.3f}, {check[1]:+.3f}]" in line


def test_the_committed_arms_study_answers_with_the_mid_overlap_multiplier_and_its_rate():
    doc = json.loads((RESULTS / "k2_vs_k3-cpu_v2" / "fit.json").read_text())
    comparison = read_comparisons(doc["results"])["c_6n"]
    lines = answer_lines(doc)
    assert lines == multiplier_answers(comparison, "k3")
    route = comparison.routes["envelope"]
    middle = route.multiplier["k3"][len(comparison.compute) // 2]
    lo, hi = middle.interval
    assert f"M = {middle.value:.3g} [{lo:.3g}, {hi:.3g}]" in lines[0]
    rate = route.rate["k3"]
    assert f"= {rate.value:+.3f} [{rate.interval[0]:+.3f}, {rate.interval[1]:+.3f}]" in lines[1]
    # A skipped route (the surface on two ratios per size) says why it answers nothing.
    (surface,) = [line for line in lines if "surface route" in line]
    assert "not identified (" in surface and "2 token budgets at a size" in surface


def test_the_brief_report_is_the_answers_and_the_rerun_check(capsys):
    from k3scale.cli import main

    folder = RESULTS / "cosine_vs_wsd-cpu_v2"
    study = RESULTS.parents[1] / "experiments" / "cosine_vs_wsd.py"
    args = ["study", "report", str(study), "--preset", "cpu_v2", "--study-dir", str(folder)]
    assert main([*args, "--brief"]) == 0
    lines = capsys.readouterr().out.splitlines()
    doc = json.loads((folder / "fit.json").read_text())
    assert [line.removeprefix("ANSWER: ") for line in lines if line.startswith("ANSWER: ")] == (
        answer_lines(doc)
    )
    assert lines[-1].startswith("re-runs held by their seeds' 95% predictive intervals")
    assert not any("MLflow" in line or line.startswith("compute multiplier") for line in lines)
