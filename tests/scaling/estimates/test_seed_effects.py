"""Seed effects (methods.md 4.8): components recovered from simulated levels, draws that share
a seed's effect across cells, and an estimator levelled to its cell's seeds."""

from __future__ import annotations

import numpy as np

from k3scale.scaling.estimates import seed_effects
from k3scale.scaling.estimates.seed_effects import SeedLevel


def _levels(rng, cells: int, seeds: int, shared_sd: float, cell_sd: float, share: float = 0.0):
    """Cells in pairs of one slot; loss = cell mean + u_seed + w (slot part shared by a pair)."""
    u = shared_sd * rng.standard_normal(seeds)
    levels = []
    for c in range(cells):
        slot = ("k3", f"s{c // 2}", 1000)
        if c % 2 == 0:
            slot_part = rng.standard_normal(seeds)
        own = rng.standard_normal(seeds)
        w = cell_sd * (np.sqrt(share) * slot_part + np.sqrt(1 - share) * own)
        losses = 4.0 - 0.1 * c + u + w
        levels.append(SeedLevel(slot, tuple(range(seeds)), tuple(losses.tolist())))
    return levels


def test_the_components_are_recovered_from_many_cells_and_seeds():
    rng = np.random.default_rng(0)
    found = [
        seed_effects.estimate_components(_levels(rng, 40, 12, 0.02, 0.015, share=0.6))
        for _ in range(30)
    ]
    assert abs(np.mean([f.shared_sd for f in found]) - 0.02) < 0.003
    assert abs(np.mean([f.cell_sd for f in found]) - 0.015) < 0.001
    # The residuals of a pair share `share` of w, less what the cell means absorb.
    assert 0.4 < np.mean([f.slot_share for f in found]) < 0.7
    assert found[0].shared_df == 11 and found[0].cell_df == 40 * 12 - 40 - 11


def test_seed_effects_sum_to_zero_and_follow_the_seeds():
    levels = [
        SeedLevel(("k2", "s1", 10), (0, 1, 2), (4.00, 4.05, 4.02)),
        SeedLevel(("k2", "s2", 10), (0, 1, 2), (3.80, 3.86, 3.81)),
        SeedLevel(("k2", "s3", 10), (0, 1), (3.60, 3.64)),
    ]
    found = seed_effects.estimate_components(levels)
    effects = found.seed_means
    assert abs(sum(effects.values())) < 1e-12
    assert effects[0] < effects[2] < effects[1]


def test_one_seed_or_no_residual_freedom_gives_no_components():
    one_seed = [SeedLevel(("a", "s", 1), (0,), (4.0,)) for _ in range(5)]
    assert seed_effects.estimate_components(one_seed) is None
    saturated = [SeedLevel(("a", "s", 1), (0, 1), (4.0, 4.1))]
    assert seed_effects.estimate_components(saturated) is None


def _known(shared_sd: float, cell_sd: float, slot_share: float) -> seed_effects.SeedComponents:
    """Components known to 200 degrees of freedom (their draws barely widen)."""
    return seed_effects.SeedComponents(
        shared_sd=shared_sd,
        shared_df=200,
        cell_sd=cell_sd,
        cell_df=200,
        slot_share=slot_share,
        seed_means={},
    )


def test_cells_on_the_same_seeds_share_the_seed_draws_and_their_difference_cancels_them():
    components = _known(shared_sd=0.03, cell_sd=0.001, slot_share=0.0)
    a = SeedLevel(("k2", "s1", 10), (0, 1, 2), (4.0, 4.0, 4.0))
    b = SeedLevel(("k3", "s1", 10), (0, 1, 2), (3.9, 3.9, 3.9))
    other = SeedLevel(("k3", "s2", 10), (3, 4, 5), (3.9, 3.9, 3.9))
    draws_a, draws_b, draws_other = seed_effects.level_error_draws(
        components, [a, b, other], 20_000, np.random.default_rng(1)
    )
    # The mean of three seeds' u: sd 0.03 / sqrt(3) in each cell ...
    assert abs(np.std(draws_a) - 0.03 / np.sqrt(3)) < 0.001
    # ... shared by cells on the same seeds, independent on other seeds.
    assert np.std(draws_a - draws_b) < 0.002
    assert abs(np.std(draws_a - draws_other) - 0.03 * np.sqrt(2 / 3)) < 0.001


def test_a_slot_share_pairs_the_cells_of_one_slot():
    components = _known(shared_sd=0.0, cell_sd=0.02, slot_share=0.8)
    cosine = SeedLevel(("k3", "s1", 10), (0,), (4.0,))
    wsd = SeedLevel(("k3", "s1", 10), (0,), (4.0,))
    budget = SeedLevel(("k3", "s1", 20), (0,), (4.0,))
    c, w, b = seed_effects.level_error_draws(
        components, [cosine, wsd, budget], 20_000, np.random.default_rng(2)
    )
    assert abs(np.corrcoef(c, w)[0, 1] - 0.8) < 0.02
    assert abs(np.corrcoef(c, b)[0, 1]) < 0.03


def test_a_tuned_level_read_off_its_quadratic_is_weighed_by_its_share_of_e():
    """Re-runs carry w + e; the tuned seed's fitted value carries w and only `leverage` of e.
    Given e, the re-runs' sd is recovered (a fit that ignored the difference would read it low)."""
    rng = np.random.default_rng(5)
    e_sd, w_sd, leverage = 0.02, 0.01, 0.3
    found = []
    for _ in range(40):
        levels = []
        for c in range(30):
            w = w_sd * rng.standard_normal(3)
            e = e_sd * rng.standard_normal(3) * np.sqrt([leverage, 1.0, 1.0])
            losses = 4.0 - 0.05 * c + w + e
            levels.append(SeedLevel(("a", f"s{c}", 1), (0, 1, 2), tuple(losses), leverage))
        found.append(seed_effects.estimate_components(levels, within_seed_sd=e_sd).cell_sd)
    assert abs(np.mean(found) - np.hypot(e_sd, w_sd)) < 0.0008


def test_a_slot_share_must_stand_out_from_its_noise():
    rng = np.random.default_rng(6)
    shares = [
        seed_effects.estimate_components(_levels(rng, 12, 3, 0.0, 0.02, share=0.0)).slot_share
        for _ in range(200)
    ]
    # Unpaired cells: a share is read into noise in about 5% of studies, not half of them.
    assert np.mean(np.array(shares) > 0) < 0.1
