"""The ablation study end to end on a simulated study with known worths: `k3scale fit
k3_ablations` writes the component effects, the report and README table print them, and the
forest plot draws one row per arm: its loss difference always, its multiplier beside its anchor
where the full model's frontier prices it (issues 38, 47)."""

from __future__ import annotations

import copy
import json
import re

import pytest

from k3scale.bench.calibrate import design_from_study
from k3scale.cli import main
from k3scale.errors import K3ScaleError
from k3scale.scaling.answers import answer_lines
from k3scale.scaling.headline import headline_lines, markdown_tables
from k3scale.scaling.inputs.simulate import Truth, simulated_tables
from k3scale.scaling.inputs.tables import write_tables
from k3scale.scaling.values.text import diff_text
from k3scale.viz import components
from k3scale.viz.fits import DashboardFits

WORTH = {"mla_only": 1.16, "no_attnres": 1.25, "adamw": 1.4}


def _fit(tmp_path, preset: str) -> dict:
    world = Truth(
        multiplier=2.5,
        noise_sd=0.01,
        seed_sd=0.01,
        cell_seed_sd=0.008,
        arch_multipliers=tuple((arm, 2.5 / m) for arm, m in WORTH.items()),
    )
    folder = tmp_path / preset
    write_tables(*simulated_tables(design_from_study("k3_ablations", preset), world, 1), folder)
    out = folder / "fit.json"
    assert main(["fit", "k3_ablations", "--from", str(folder), "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("ablation"), "cpu")


def _loss_reading(line: str, arm: str) -> tuple[float, float, float]:
    """The 'loss ARM - k3 on the re-runs: +v [+lo, +hi] nats' a line prints, as numbers."""
    found = re.search(
        rf"loss {arm} - k3 on the re-runs: ([+-][\d.]+) \[([+-][\d.]+), ([+-][\d.]+)\] nats", line
    )
    assert found, line
    return tuple(float(v) for v in found.groups())


def test_the_report_and_table_give_every_arm_the_control_and_the_sum_check(document):
    lines = headline_lines(document)
    arms = document["results"]["component_effects"]["c_6n"]["arms"]
    assert len(arms) == 11  # ten arms and K2
    assert sum(line.startswith(tuple(arms)) for line in lines) == 11
    assert any("adamw (positive control)" in line for line in lines)
    assert any(line.startswith("sum check (c_6n): k3 over k2 M = ") for line in lines)
    # The cpu design's 4 cells: k3's frontier law is refused and its monotone frontier does not
    # reach the arms' losses below its cheapest cell, so the control is read in loss.
    assert not arms["adamw"]["multiplier"]["verdict"].startswith("identified")
    control, summed = answer_lines(document)
    assert control.startswith("positive control adamw (positive control: Muon -> AdamW")
    value, lo, hi = _loss_reading(control, "adamw")
    # Signed on the re-run seeds that did not choose the points (issue 47).
    stored = arms["adamw"]["loss"]["selection_free"]
    assert (value, lo, hi) == pytest.approx((stored["value"], *stored["ci"]), abs=5e-4)
    # AdamW is worth 1.4x in the simulated world: the design sees it, as a loss above 0.
    assert lo > 0 and "its worth in compute (6ND) is not identified (" in control
    assert "no evidence" not in control
    assert summed.startswith("sum check (6ND): k3 over k2 M = ")
    table = markdown_tables(document)
    assert "| component | switched back | loss arm - k3 [95%] | M (c_6n) [95%] |" in table
    assert "Kimi Linear, arXiv 2510.26692" in table and "Sum check (c_attn)" in table
    row = next(line for line in table.splitlines() if line.startswith("| adamw | positive"))
    assert f"| {value:+.3f} [{lo:+.3f}, {hi:+.3f}] (re-runs; all seeds " in row


def test_the_forest_plot_draws_each_arms_loss_difference_and_says_why_no_multiplier(document):
    fits = DashboardFits.from_artifact(document)
    effects = fits.component_effects["c_6n"].effects
    panel = components.forest_panel(fits, "c_6n")
    (drawn,) = [t for t in panel.figure.data if t.name == "loss difference [95%]"]
    assert len(drawn.y) == 11
    rows = dict(zip(drawn.y, zip(drawn.x, drawn.error_x.arrayminus, drawn.error_x.array)))
    loss = effects["adamw"].loss.selection_free  # the signed reading (issue 47)
    x, down, up = rows["adamw (positive control)"]
    assert x == loss.value
    assert (x - down, x + up) == pytest.approx(tuple(loss.interval), rel=1e-12)
    assert list(drawn.y)[-1] == "k3 over k2 (the whole gap)"
    # No arm's multiplier is identified here: no multiplier axis, no anchor set beside nothing.
    assert not [t for t in panel.figure.data if t.name in ("multiplier [95%]", "published anchor")]
    assert "xaxis2" not in panel.figure.layout.to_plotly_json()
    assert "no arm's multiplier to k3 is identified, so none is drawn" in panel.caption
    for reason in {e.multiplier.verdict.reason for e in effects.values()}:
        assert panel.caption.count(reason) == 1
    assert f"positive control adamw: loss {diff_text(loss)} nats" in panel.caption
    assert "mla_only 1.16x, no_attnres 1.25x" in panel.caption
    assert "Diamonds" not in panel.caption and "Ratio convention" not in panel.note


def _priced(document: dict, multipliers: dict[str, tuple[float, float, float]]) -> dict:
    """The document with the named arms' c_6n multipliers identified at (value, lo, hi)."""
    doc = copy.deepcopy(document)
    arms = doc["results"]["component_effects"]["c_6n"]["arms"]
    for arm, (value, lo, hi) in multipliers.items():
        arms[arm]["multiplier"].update(value=value, ci=[lo, hi], verdict="identified")
    return doc


def test_the_forest_plot_sets_identified_multipliers_beside_their_anchors(document):
    priced = {"adamw": (1.38, 1.2, 1.6), "mla_only": (1.1, 0.95, 1.3), "k2": (2.4, 2.0, 2.9)}
    fits = DashboardFits.from_artifact(_priced(document, priced), source="edited fixture")
    effects = fits.component_effects["c_6n"].effects
    panel = components.forest_panel(fits, "c_6n")
    (loss,) = [t for t in panel.figure.data if t.name == "loss difference [95%]"]
    (drawn,) = [t for t in panel.figure.data if t.name == "multiplier [95%]"]
    assert len(loss.y) == 11 and drawn.xaxis == "x2" and loss.xaxis == "x"
    rows = dict(zip(drawn.y, drawn.x, strict=True))
    assert rows == {
        "adamw (positive control)": 1.38,
        "mla_only": 1.1,
        "k3 over k2 (the whole gap)": 2.4,
    }
    anchors = next(t for t in panel.figure.data if t.name == "published anchor")
    assert sorted(anchors.x) == [1.16, 1.4, 2.5] and anchors.xaxis == "x2"
    assert panel.figure.layout.xaxis2.type == "log"
    assert "multiplier M to k3 (right; bars: 95% interval): identified for 3 of 11 arms" in (
        panel.caption
    )
    # Every arm without a multiplier is named, in a list before its reason.
    for arm in set(effects) - set(priced):
        reason = re.escape(effects[arm].multiplier.verdict.reason)
        assert re.search(rf"[\w, ]*\b{arm}\b[\w, ]* \({reason}\)", panel.caption), arm
    assert "positive control adamw: loss " in panel.caption and ", M = 1.38 [1.2, 1.6]" in (
        panel.caption
    )
    assert "published anchors of arms without a multiplier (not drawn): no_attnres 1.25x" in (
        panel.caption
    )
    assert "Diamonds: published anchors" in panel.caption and "Ratio convention" in panel.note


def test_a_design_without_a_frontier_draws_no_multiplier_and_says_why(tmp_path):
    document = _fit(tmp_path, "demo")
    fits = DashboardFits.from_artifact(document)
    effects = fits.component_effects["c_6n"]
    assert all(not e.multiplier.identified for e in effects.effects.values())
    control = answer_lines(document)[0]
    assert "its worth in compute (6ND) is not identified (" in control
    assert "frontier is not identified" in control
    panel = components.forest_panel(fits, "c_6n")
    assert not [t for t in panel.figure.data if t.name == "multiplier [95%]"]
    (reason,) = {e.multiplier.verdict.reason for e in effects.effects.values()}
    assert "frontier is not identified" in reason
    # Every arm shares the reason: said once.
    assert f"no arm's multiplier to k3 is identified, so none is drawn ({reason})" in panel.caption
    with pytest.raises(K3ScaleError, match="component effects \\(c_9\\) not drawn"):
        components.forest_panel(fits, "c_9")
