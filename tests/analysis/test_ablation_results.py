"""The ablation study's committed calibration bears out what analysis/README.md says of its cpu
design (issue 38: coverage 0.90-0.98, no-effect false-positive rate at most 0.06; the README
says at most 0.05; issue 47: multipliers read only where K3's law passes its checks); the
numbers themselves are a generated block (test_readme_tables)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "analysis" / "results"


@pytest.fixture(scope="module")
def scenarios() -> dict:
    calibration = json.loads((RESULTS / "calibration" / "k3_ablations-cpu.json").read_text())
    return calibration["scenarios"]["k3_ablations"]


def test_every_interval_of_the_cpu_design_covers_its_truth_at_90_to_98_percent(scenarios):
    for name, quantities in scenarios.items():
        for quantity, row in quantities.items():
            if quantity.startswith("M_"):
                # Read only where K3's law passes its checks: "0.37-0.46 of the studies".
                assert 0.365 <= row["identified_rate"] <= 0.465, (name, quantity)
                assert 0.925 <= row["coverage"] <= 0.975, (name, quantity)  # "0.93-0.97"
            else:
                # Coverage is over the identified studies: at most 1 in 100 left out.
                assert row["identified_rate"] >= 0.99, (name, quantity)
                assert 0.90 <= row["coverage"] <= 0.98, (name, quantity, row["coverage"])


def test_no_null_effect_is_detected_in_more_than_5_percent_of_studies(scenarios):
    # diff_k2 is no null: K2, unmatched, sits at another N, so its loss differs under one law.
    nulls = {q: row for q, row in scenarios["no_effect"].items() if q.startswith(("M_", "diff_"))}
    nulls.pop("diff_k2")
    assert len(nulls) == 21
    assert max(row["detect_rate"] for row in nulls.values()) <= 0.05
    assert max(row["detect_rate"] for q, row in nulls.items() if q.startswith("M_")) <= 0.02
    assert scenarios["no_effect"]["diff_k2"]["detect_rate"] == 1.0


def test_the_anchored_components_would_be_seen_at_their_anchors(scenarios):
    for arm in ("mla_only", "no_attnres", "adamw", "k2"):
        assert scenarios["anchors"][f"diff_{arm}"]["detect_rate"] >= 0.99, arm
        # The multiplier resolves the anchor in every study where it is read.
        multiplier = scenarios["anchors"][f"M_{arm}"]
        assert multiplier["detect_rate"] == multiplier["identified_rate"], arm


@pytest.fixture(scope="module")
def effects() -> dict:
    from k3scale.scaling import component_text

    fit = json.loads((RESULTS / "k3_ablations-cpu" / "fit.json").read_text())
    return component_text.read(fit["results"])


def _loss(effects: dict, arm: str) -> tuple[float, float]:
    """The signed loss difference arm - K3 (nats; positive: the component helps K3)."""
    from k3scale.scaling.component_text import signed_loss

    signed = signed_loss(effects["c_6n"].effects[arm])
    assert signed.identified, arm
    return tuple(signed.interval)


def test_the_readme_s_reading_of_the_cpu_study_holds(effects):
    """Each bullet of "How to read it" under the cpu study's table in analysis/README.md."""
    arms = effects["c_6n"].effects
    # No multiplier is signed: K3's law is refused and its monotone frontier cannot reach.
    assert not any(e.multiplier.identified for e in arms.values())
    assert "frontier law is refused" in effects["c_6n"].method
    # Every arm is signed on its re-runs (the selection-free reading).
    assert all(e.loss.selection_free.identified for e in arms.values())
    assert _loss(effects, "adamw")[0] > 0  # the control is seen, in loss
    control, hybrid = (arms[a].loss.selection_free.value for a in ("adamw", "mla_only"))
    assert _loss(effects, "mla_only")[0] > 0 and abs(hybrid - control) < 0.02  # its size
    lo, hi = _loss(effects, "no_attnres")
    assert lo < 0 < hi and arms["no_attnres"].loss.mean.interval[1] < 0  # all seeds: below 0
    helps = sorted(arm for arm in arms if _loss(effects, arm)[0] > 0)
    assert helps == ["adamw", "k2", "latent_no_norm", "mla_only", "ungated_mla"]
    assert not [arm for arm in arms if _loss(effects, arm)[1] < 0]
    for arm in ("plain_moe", "rope_mla", "swiglu", "loss_free_balancing", "full_matrix_muon"):
        lo, hi = _loss(effects, arm)
        assert lo < 0 < hi, arm
