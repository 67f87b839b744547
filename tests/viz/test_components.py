"""The ablation study end to end on a simulated study with known worths: `k3scale fit
k3_ablations` writes the component effects, the report and README table print them, and the
forest plot draws one row per arm with its anchor (issue 38)."""

from __future__ import annotations

import json

import pytest

from k3scale.bench.calibrate import design_from_study
from k3scale.cli import main
from k3scale.errors import K3ScaleError
from k3scale.scaling.answers import answer_lines
from k3scale.scaling.headline import headline_lines, markdown_tables
from k3scale.scaling.inputs.simulate import Truth, simulated_tables
from k3scale.scaling.inputs.tables import write_tables
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


def test_the_report_and_table_give_every_arm_the_control_and_the_sum_check(document):
    lines = headline_lines(document)
    arms = document["results"]["component_effects"]["c_6n"]["arms"]
    assert len(arms) == 11  # ten arms and K2
    assert sum(line.startswith(tuple(arms)) for line in lines) == 11
    assert any("adamw (positive control)" in line for line in lines)
    assert any(line.startswith("sum check (c_6n): k3 over k2 M = ") for line in lines)
    control, summed = answer_lines(document)
    assert control.startswith("positive control adamw (positive control: Muon -> AdamW")
    assert "excluding no advantage (M = 1)" in control and "no evidence" not in control
    assert summed.startswith("sum check (6ND): k3 over k2 M = ")
    table = markdown_tables(document)
    assert "| component | switched back | loss arm - k3 [95%] | M (c_6n) [95%] |" in table
    assert "Kimi Linear, arXiv 2510.26692" in table and "Sum check (c_attn)" in table
    row = next(line for line in table.splitlines() if line.startswith("| adamw | positive"))
    assert "| helps (excludes 1) |" in row


def test_the_forest_plot_draws_each_arm_with_its_interval_and_anchor(document):
    fits = DashboardFits.from_artifact(document)
    panel = components.forest_panel(fits, "c_6n")
    drawn = [t for t in panel.figure.data if t.name == "multiplier [95%]"]
    assert len(drawn) == 1 and len(drawn[0].y) == 11
    rows = dict(zip(drawn[0].y, drawn[0].x, strict=True))
    effects = fits.component_effects["c_6n"].effects
    assert rows["adamw (positive control)"] == effects["adamw"].multiplier.value
    assert list(drawn[0].y)[-1] == "k3 over k2 (the whole gap)"
    anchors = next(t for t in panel.figure.data if t.name == "published anchor")
    assert sorted(anchors.x) == [1.16, 1.25, 1.4, 2.5]
    assert "positive control adamw: M = " in panel.caption


def test_a_design_without_a_frontier_is_not_drawn_and_says_why(tmp_path):
    document = _fit(tmp_path, "demo")
    fits = DashboardFits.from_artifact(document)
    effects = fits.component_effects["c_6n"]
    assert all(not e.multiplier.identified for e in effects.effects.values())
    control = answer_lines(document)[0]
    assert "no evidence that its component does nothing" in control
    with pytest.raises(K3ScaleError, match="frontier law is not identified"):
        components.forest_panel(fits, "c_6n")
    with pytest.raises(K3ScaleError, match="component effects \\(c_9\\) not drawn"):
        components.forest_panel(fits, "c_9")
