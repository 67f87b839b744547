"""One sentence per claim: the numbers are the artifact's, and the words say what the interval
holds, read forwards, and which reading is signed."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from k3scale.scaling import study
from k3scale.scaling.answers import answer_lines, difference_answer, multiplier_answers
from k3scale.scaling.values.fitdoc import Comparison, PooledDifference, Route, read_comparisons
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.scaling.values.verdict import Verdict

RESULTS = Path(__file__).resolve().parents[2] / "analysis" / "results"


def _pooled(value, lo, hi, free: Estimate | None = None) -> PooledDifference:
    """Six cells pooled; with `free`, its 12 re-run pairs (5 cosine lower, 7 WSD lower)."""
    mean = Estimate(value, [lo, hi], Verdict())
    if free is None:
        return PooledDifference(6, 6, 3, mean)
    signs = {"cosine lower": 5, "wsd lower": 7}
    return PooledDifference(
        6, 6, 3, mean, selection_free=free, pairs=12, pair_cells=6, pair_signs=signs
    )


@pytest.mark.parametrize(
    ("interval", "says"),
    [
        ((-0.03, -0.01), "cosine lower by 0.010 to 0.030"),
        ((0.001, 0.021), "wsd lower by 0.001 to 0.021"),
        (
            (-0.017, 0.021),
            "not resolved: the interval holds 0, from cosine lower by 0.017 to wsd lower by 0.021",
        ),
    ],
)
def test_a_difference_says_what_its_interval_holds_read_forwards(interval, says):
    line = difference_answer(_pooled(sum(interval) / 2, *interval), "cosine", "wsd")
    assert f"[{interval[0]:+.3f}, {interval[1]:+.3f}] nats, {says}." in line
    # Without re-runs on other seeds the pooled mean is signed, and the line says what it leans on.
    assert "with the tuning seed that chose the points (no paired re-runs on other seeds)" in line
    assert "excludes" not in line


def test_the_reruns_off_the_tuning_seed_are_signed_and_the_pooled_mean_is_context():
    free = Estimate(-0.006, [-0.010, -0.002], Verdict())
    line = difference_answer(_pooled(0.011, -0.002, 0.022, free), "cosine", "wsd")
    signed, context = line.split(" As context, ")
    assert signed.startswith("cosine - wsd on the re-runs that did not choose the points (12 pairs")
    assert "the tuning seed chose each schedule's point" in signed
    assert "-0.006 [-0.010, -0.002] nats, cosine lower by 0.002 to 0.010;" in signed
    assert signed.endswith("cosine lower in 5 and wsd lower in 7 of 12 pairs.")
    assert context.startswith("all seeds pooled over 6 of 6 cells (paired by seed): +0.011")
    # Too few pairs for an interval: the pooled mean is signed, and the line says why.
    few = Estimate(0.01, None, Verdict("only 2 pairs of re-runs off the tuning seed"))
    fallback = difference_answer(_pooled(0.011, -0.002, 0.022, few), "cosine", "wsd")
    assert "(the selection-free reading is not identified: only 2 pairs of re-runs" in fallback
    assert "As context" not in fallback


def test_an_unidentified_difference_says_why():
    p = PooledDifference(6, 1, 1, Estimate(None, None, Verdict("1 identified cell")))
    assert difference_answer(p, "cosine", "wsd").endswith("not identified (1 identified cell).")


def test_the_v3_tables_sign_the_reruns_at_matched_seeds():
    """cosine_vs_wsd cpu_v3 (issue 47): seed 3 chose the points, seeds 4 and 5 re-ran them."""
    runs = pl.read_parquet(RESULTS / "cosine_vs_wsd-cpu_v3" / "runs.parquet")
    opts = study.StudyOptions(num_resamples=200)
    usable, _ = study.usable_runs(runs, opts)
    estimates, noise = study.cell_estimates(usable, opts)
    doc = {
        "results": {
            "schedule_comparison": study.schedule_comparison(estimates, noise, "cosine", opts)
        }
    }
    (line,) = answer_lines(doc)
    # The t-interval over 12 pairs needs no draws: these numbers do not depend on the resamples.
    assert "(12 pairs at matched seeds in 6 of 6 cells;" in line
    assert "+0.004 [-0.011, +0.018] nats, not resolved: the interval holds 0" in line
    assert "cosine lower in 5 and wsd lower in 7 of 12 pairs." in line


def test_the_committed_schedule_study_answers_with_its_stored_pooled_difference():
    doc = json.loads((RESULTS / "cosine_vs_wsd-cpu_v2" / "fit.json").read_text())
    pooled = doc["results"]["schedule_comparison"]["pooled"]["wsd"]
    (line,) = answer_lines(doc)
    lo, hi = pooled["ci"]
    assert f"{pooled['mean_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] nats" in line
    check = pooled["across_sizes"]["ci"]
    assert f"[{check[0]:+.3f}, {check[1]:+.3f}]" in line


def test_the_committed_arms_study_answers_from_the_routes_that_pass_and_names_the_rest():
    """k2_vs_k3 cpu_v2 (issue 47): K2's laws are refused and the surface is skipped, so the
    monotone route reads M alone, unconfirmed; the refused and skipped routes say why."""
    doc = json.loads((RESULTS / "k2_vs_k3-cpu_v2" / "fit.json").read_text())
    comparison = read_comparisons(doc["results"])["c_6n"]
    lines = answer_lines(doc)
    assert lines == multiplier_answers(comparison, "k3")
    middle = len(comparison.compute) // 2
    m = comparison.routes["monotone"].multiplier["k3"][middle]
    lo, hi = m.interval
    assert f"only the monotone route M = {m.value:.3g} [{lo:.3g}, {hi:.3g}]" in lines[0]
    assert "(no second route to confirm it)" in lines[0]
    rate = comparison.routes["monotone"].rate["k3"]
    assert f"{rate.value:+.3f} [{rate.interval[0]:+.3f}, {rate.interval[1]:+.3f}]" in lines[1]
    refused = lines[2]
    assert "envelope (the frontier law of k2 is refused (" in refused
    assert "surface (k2: 2 token budgets at a size" in refused
    assert not any("M = " in line for line in lines[2:])  # a refused route prints no number


def _comparison(values: dict[str, tuple[float, float, float]]) -> Comparison:
    """One new arm over a baseline at three computes; each route's M the same at all three."""
    routes = {
        name: Route(
            {},
            {"k3": [Estimate(v, [lo, hi], Verdict())] * 3},
            {"k3": Estimate(0.0, [-0.1, 0.1], Verdict())},
        )
        for name, (v, lo, hi) in values.items()
    }
    return Comparison("k2", (1e11, 2e11, 4e11), routes)


def test_routes_that_agree_sign_each_reading_and_routes_that_disagree_sign_none():
    agree = multiplier_answers(
        _comparison({"envelope": (2.0, 1.6, 2.4), "monotone": (2.2, 1.8, 2.7)}), "k3"
    )
    assert "the routes that pass agree: envelope route M = 2 [1.6, 2.4]" in agree[0]
    assert "monotone route M = 2.2 [1.8, 2.7], an advantage of 1.8x to 2.7x" in agree[0]
    apart = multiplier_answers(
        _comparison({"envelope": (1.2, 1.0, 1.4), "monotone": (3.0, 2.5, 3.5)}), "k3"
    )
    assert (
        "the routes that pass disagree (envelope, monotone: from 1.2 to 3), so no number is"
        in (apart[0])
    )
    assert "M = " not in apart[0]


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
