"""Component effects of an ablation study: the frontier law's inverse, multipliers recovered from
simulated studies with known truths, the power formula and the sum check (issue 38)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import norm

from k3scale.bench.calibrate import design_from_study
from k3scale.scaling import ablation, study
from k3scale.scaling.artifact import load_recipe
from k3scale.scaling.estimates import arm_effects
from k3scale.scaling.estimates.arm_effects import LogMultiplier
from k3scale.scaling.inputs.simulate import Truth, simulate_runs
from k3scale.scaling.laws.frontier import (
    fit_frontier_grid,
    frontier_grid_log_compute,
    predict_frontier_grid,
)
from k3scale.scaling.values.components import ComponentEffects

# What each arm is worth to K3 in the simulated truths: the published anchors, LatentMoE at 1.1x
# and every other component at 1 (K3 over K2 at the report's 2.5x).
WORTH = {"mla_only": 1.16, "no_attnres": 1.25, "adamw": 1.4, "plain_moe": 1.1}
K3_OVER_K2 = 2.5


def truth(noise_sd: float = 0.0, **seeds) -> Truth:
    return Truth(
        multiplier=K3_OVER_K2,
        noise_sd=noise_sd,
        arch_multipliers=tuple((arm, K3_OVER_K2 / m) for arm, m in WORTH.items()),
        **seeds,
    )


def effects(preset: str, world: Truth, seed: int = 0, conv: str = "c_6n") -> ComponentEffects:
    runs = simulate_runs(design_from_study("k3_ablations", preset), world, seed)
    estimates, _ = study.cell_estimates(runs, study.StudyOptions(num_resamples=200, seed=seed))
    return ablation.component_effects(estimates, load_recipe("k3_ablations").declared(), conv)


def test_the_frontier_law_s_inverse_gives_back_the_compute_of_each_loss():
    log_c = np.log(np.geomspace(1e10, 1e13, 5))
    losses = 2.0 + np.array([[30.0], [45.0]]) * np.exp(-np.array([[0.2], [0.35]]) * log_c)
    params = fit_frontier_grid(log_c, losses, np.ones_like(losses, dtype=bool))
    at = np.log(np.array([3e10, 2e12]))
    for j in range(len(at)):
        reached = predict_frontier_grid(params, log_c, at[j : j + 1])[:, 0]
        assert frontier_grid_log_compute(params, log_c, reached) == pytest.approx(at[j], rel=1e-9)
    below_the_floor = frontier_grid_log_compute(params, log_c, params[:, 0] - 0.01)
    assert np.isnan(below_the_floor).all()


def test_noise_free_multipliers_recover_each_component_s_worth():
    got = effects("cpu", truth())
    for arm, worth in WORTH.items():
        # The cells are fixed (N, D), not compute-optimal, and the law runs through 4 of them:
        # noise free the readings sit 1-3% off the truth on this design (documented in
        # arm_effects); 3.5% bounds that and fails a reading of the wrong size (1.16 vs 1.25).
        assert got.effects[arm].multiplier.value == pytest.approx(worth, rel=0.035), arm
    for arm in ("rope_mla", "swiglu", "loss_free_balancing", "full_matrix_muon"):
        assert got.effects[arm].multiplier.value == pytest.approx(1.0, abs=1e-9), arm
    # Without its gate the MLA has fewer parameters; the arm gets them back in the dense FFN to
    # within one width step, so its cells sit at nearly K3's N: worth 1, read within that.
    assert got.effects["ungated_mla"].multiplier.value == pytest.approx(1.0, abs=0.01)
    assert got.sum_check.gap.value == pytest.approx(K3_OVER_K2, rel=0.035)


def test_with_seed_noise_a_refused_law_gives_way_to_the_monotone_frontier():
    """One realization of the cpu design with seed noise (issue 47): K3's law through its 4
    Pareto cells misses them beyond their noise (the fixed tokens-per-parameter cells zigzag
    about any one law), so the multipliers are read off K3's monotone frontier, which cannot
    reach below K3's cheapest cell: no pooled multiplier is signed, and the reason says so.
    The loss differences, which need no frontier, still see the control."""
    world = truth(noise_sd=0.012, seed_sd=0.017, cell_seed_sd=0.010, slot_share=0.28)
    got = effects("cpu", world, seed=0)
    assert "monotone frontier" in got.method and "frontier law is refused" in got.method
    control = got.effects["adamw"]
    assert not control.multiplier.identified
    assert "monotone frontier reads no C*" in control.multiplier.verdict.reason
    lo, _ = control.loss.mean.interval
    assert lo > 0  # AdamW in place of Muon costs loss, seen at this noise


def test_the_sum_check_multiplies_the_components_and_leaves_the_rest():
    got = effects("cpu", truth())  # noise free: the law has nothing to reject, and is used
    assert "frontier law (envelope route)" in got.method
    check = got.sum_check
    product = np.prod([got.effects[a].multiplier.value for a in check.arms])
    assert check.explained.value == pytest.approx(product, rel=1e-9)
    assert check.left_over.value * check.explained.value == pytest.approx(check.gap.value)


def test_a_full_model_with_one_cell_gives_no_multiplier_and_says_why():
    got = effects("demo", truth())
    m = got.effects["adamw"].multiplier
    assert not m.identified and "frontier is not identified" in m.verdict.reason
    assert got.effects["adamw"].loss.mean.value > 0  # the loss difference still reads


def test_power_is_the_level_at_no_effect_and_grows_with_the_effect():
    se = 0.05
    draws = norm.ppf(np.linspace(0.0005, 0.9995, 2000)) * se
    assert arm_effects.power(1.0, draws) == pytest.approx(0.05, abs=0.002)
    # An effect 2.8 standard errors from 1 is seen 80% of the time by a two-sided 95% interval.
    assert arm_effects.power(np.exp(2.8 * se), draws) == pytest.approx(0.80, abs=0.01)
    assert arm_effects.power(1.5, np.full(5, 0.1)) is None


def test_a_sum_with_a_missing_component_is_not_identified_and_names_it():
    log = LogMultiplier(0.1, np.full(50, 0.1))
    check = arm_effects.sum_check("k2", log, {"mla_only": log, "swiglu": None})
    assert not check.gap.identified and "swiglu" in check.gap.verdict.reason


def test_component_effects_survive_the_artifact_round_trip():
    got = effects("cpu", truth(noise_sd=0.005))
    doc = json.loads(json.dumps(got.to_json()))
    assert ComponentEffects.from_json(doc).to_json() == doc
