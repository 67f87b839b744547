"""Compute-optimal frontiers by two routes and the multiplier between arms."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from k3scale.scaling.estimates import compute_optimal as co
from k3scale.scaling.laws.frontier import FRONTIER_EXPONENTS, multiplier
from k3scale.scaling.laws.surface import fit_surface_grid

TRUE = np.array([2.0, 400.0, 0.35, 900.0, 0.3])  # E, A, alpha, B, beta (exponents on the grid)


def surface_loss(params, n, d):
    e, a, alpha, b, beta = params
    return e + a * n**-alpha + b * d**-beta


def shifted(params, k):
    """The surface whose compute-optimal frontier is `params`' at k times the compute."""
    e, a, alpha, b, beta = params
    share = beta / (alpha + beta)
    return np.array([e, a * k ** (-share * alpha), alpha, b * k ** (-(1 - share) * beta), beta])


def arm(name, params, noise=0.0, draws=60, seed=0):
    n, d = (g.ravel() for g in np.meshgrid(np.geomspace(1e6, 1e8, 5), np.geomspace(1e8, 1e10, 5)))
    loss = surface_loss(params, n, d)
    rng = np.random.default_rng(seed)
    return co.ArmOptima(
        name=name,
        n=n,
        d=d,
        compute=6 * n * d,
        loss=loss,
        draws=loss + noise * rng.standard_normal((draws, len(loss))),
    )


def test_the_grid_surface_fit_recovers_a_noise_free_surface():
    a = arm("k2", TRUE)
    (fit,) = fit_surface_grid(a.n, a.d, a.loss[None])
    assert fit == pytest.approx(TRUE, rel=1e-6)


def test_both_routes_find_a_known_multiplier_from_noise_free_optima():
    arms = {"k2": arm("k2", TRUE), "k3": arm("k3", shifted(TRUE, 2.5))}
    result = co.compare_arms(arms, "k2", decades=1.0).to_json()
    middle = len(result["compute"]) // 2
    surface = result["routes"]["surface"]["multiplier"]["k3"][middle]
    envelope = result["routes"]["envelope"]["multiplier"]["k3"][middle]
    assert surface["value"] == pytest.approx(2.5, rel=0.02)
    # The envelope's law runs through the grid's Pareto cells, a little off the true frontier.
    assert envelope["value"] == pytest.approx(2.5, rel=0.03)
    assert surface["verdict"] == "identified"
    assert result["agreement"]["k3"][middle]["status"].startswith(("agree", "disagree"))


def test_the_envelope_is_blind_to_rounding_in_tied_computes():
    # The grid's N x D products tie, equal only to rounding; which rounding a CPU's exp and
    # BLAS paths give decided the envelope's points before (3.19 for a true 2.5 on AVX-512).
    arms = {"k2": arm("k2", TRUE), "k3": arm("k3", shifted(TRUE, 2.5))}
    rng = np.random.default_rng(0)
    jittered = {
        name: dataclasses.replace(a, compute=a.compute * (1 + 1e-12 * rng.uniform(-1, 1, a.n.size)))
        for name, a in arms.items()
    }
    exact, moved = (
        [
            m["value"]
            for m in co.compare_arms(x, "k2", decades=1.0).to_json()["routes"]["envelope"][
                "multiplier"
            ]["k3"]
        ]
        for x in (arms, jittered)
    )
    # None past the baseline's range, at the same points in both.
    assert [v is None for v in moved] == [v is None for v in exact]
    assert [v for v in moved if v is not None] == pytest.approx(
        [v for v in exact if v is not None], rel=1e-9
    )


def test_a_multiplier_read_past_the_baselines_range_is_undefined():
    base = arm("k2", TRUE)
    curve = co.envelope_frontier(base, base.loss[None], np.array([1e14, 6e18]))
    assert np.isnan(curve[0, 0]) and np.isfinite(curve[0, 1])
    grid = np.geomspace(*base.compute_range, 32)
    base_curve = co.envelope_frontier(base, base.loss[None], grid)
    below_everything = np.array([[base.loss.min() - 1.0]])
    assert np.isnan(multiplier(base_curve, grid, below_everything, np.array([1e18]))[0, 0])


def test_the_envelope_keeps_only_compute_optimal_points():
    alpha = FRONTIER_EXPONENTS[300]  # on the grid, so the fit is exact
    compute = np.array([1.0, 2.0, 4.0, 8.0])
    law = 2.0 + 3.0 * compute**-alpha
    loss = law.copy()
    loss[1] = loss[0] + 0.5  # beaten by a cheaper cell: off the frontier
    a = co.ArmOptima(
        name="a", n=np.ones(4), d=np.ones(4), compute=compute, loss=loss, draws=np.zeros((1, 4))
    )
    (curve,) = co.envelope_frontier(a, a.loss[None], compute)
    assert curve == pytest.approx(law, rel=1e-9)


def test_the_envelope_needs_three_pareto_points():
    a = co.ArmOptima(
        name="a",
        n=np.ones(3),
        d=np.ones(3),
        compute=np.array([1.0, 2.0, 4.0]),
        loss=np.array([3.0, 3.5, 2.0]),  # two Pareto points: no law through them
        draws=np.zeros((1, 3)),
    )
    assert np.all(np.isnan(co.envelope_frontier(a, a.loss[None], np.array([1.0, 2.0, 4.0]))))


def test_the_envelope_reads_no_effect_as_none_at_every_compute():
    """Chords between Pareto points zigzagged around the truth (0.95-1.04 on the cpu_v3 ladder);
    the frontier law through them does not."""
    arms = {"k2": arm("k2", TRUE), "k3": arm("k3", TRUE)}
    route = co.compare_arms(arms, "k2", decades=1.0).routes["envelope"]
    values = [e.value for e in route.multiplier["k3"] if e.value is not None]
    assert len(values) >= 7
    assert values == pytest.approx([1.0] * len(values), rel=0.01)


def test_noisy_optima_give_a_wide_interval_and_say_not_identified():
    arms = {
        "k2": arm("k2", TRUE, noise=1.0, draws=200, seed=1),
        "k3": arm("k3", shifted(TRUE, 2.5), noise=1.0, draws=200, seed=2),
    }
    result = co.compare_arms(arms, "k2", decades=1.0).to_json()
    middle = result["routes"]["surface"]["multiplier"]["k3"][4]
    assert middle["verdict"].startswith("not identified: ")
    assert middle["ci"][0] < 2.5 < middle["ci"][1]
    last = result["routes"]["surface"]["multiplier"]["k3"][-1]
    assert last["verdict"] == "not identified: M(C) undefined at this compute (extrapolation)"


def test_a_route_whose_surface_is_not_identified_identifies_no_multiplier():
    """M(C) read off a surface the data cannot identify says so at every compute (issue 33)."""
    # alpha on the exponent grid's lower edge: the data do not bound it.
    flat = np.array([2.0, 400.0, 0.05, 900.0, 0.3])
    arms = {"k2": arm("k2", flat, noise=1e-3), "k3": arm("k3", shifted(TRUE, 2.5), noise=1e-3)}
    route = co.compare_arms(arms, "k2", decades=1.0).routes["surface"]
    assert not route.arms["k2"].surface.verdict.identified
    for e in route.multiplier["k3"]:
        if e.value is not None:
            assert e.verdict.reason.startswith("the surface of k2 is not identified")
    assert not route.rate["k3"].identified


def test_the_rate_is_zero_for_a_constant_multiplier_and_signed_for_a_changing_one():
    base = arm("k2", TRUE, noise=1e-3, draws=200, seed=1)
    constant = co.compare_arms(
        {"k2": base, "k3": arm("k3", shifted(TRUE, 2.5), noise=1e-3, draws=200, seed=2)},
        "k2",
        decades=1.0,
    )
    rate = constant.routes["surface"].rate["k3"]
    # Zero up to the route's N grid (64 sizes): 0.0016 here, a 0.4% change of M over the
    # overlap's two decades of compute.
    assert rate.identified and -0.005 < rate.interval[0] <= rate.interval[1] < 0.005
    # Steeper in N and D: the new arm's loss falls faster with compute, so its advantage grows.
    steeper = np.array([2.0, 400.0, 0.4, 900.0, 0.35])
    growing = co.compare_arms(
        {"k2": base, "k3": arm("k3", steeper, noise=1e-3, draws=200, seed=2)}, "k2", decades=1.0
    )
    rate = growing.routes["surface"].rate["k3"]
    assert rate.identified and rate.interval[0] > 0


def test_a_rate_needs_three_identified_compute_values():
    estimates = [co.Estimate(2.0, [1.5, 2.5], co.Verdict())] * 2
    estimates += [co.Estimate(None, None, co.Verdict("undefined"))] * 3
    at = np.geomspace(1e10, 1e12, 5)
    rate = co.rate_of(np.full((10, 5), 2.0), np.full(5, 2.0), at, estimates)
    assert rate.verdict.reason == "M(C) identified at 2 compute values (a rate needs >= 3)"


def test_the_surface_route_refuses_a_design_with_two_budgets_per_size():
    """Two tokens-per-parameter ratios per size (the v2 designs): many distinct D, yet every
    size's D term rests on one difference."""
    n = np.repeat(np.geomspace(1e6, 1e8, 5), 2)
    d = n * np.tile([20.0, 40.0], 5)
    loss = surface_loss(TRUE, n, d)
    two = co.ArmOptima("k2", n, d, 6 * n * d, loss, np.tile(loss, (30, 1)))
    assert "2 token budgets at a size" in co.route_skip_reason(two, "surface")
    assert co.route_skip_reason(arm("k2", TRUE), "surface") is None


def _noisy(a: co.ArmOptima, loss: np.ndarray, noise: float, seed: int = 1) -> co.ArmOptima:
    """`a` with optima `loss` seen through noise of sd `noise`: the point is one draw of it."""
    rng = np.random.default_rng(seed)
    draws = loss + noise * rng.standard_normal((200, len(loss)))
    return dataclasses.replace(a, loss=loss + noise * rng.standard_normal(len(loss)), draws=draws)


def test_the_lack_of_fit_test_passes_a_separable_surface_seen_through_noise():
    a = arm("k2", TRUE)
    noisy = _noisy(a, a.loss, noise=0.003)
    (fit,) = fit_surface_grid(noisy.n, noisy.d, noisy.loss[None])
    assert co.lack_of_fit_reason(noisy, fit) is None


def test_a_seed_effect_every_optimum_shares_does_not_hide_a_misfit():
    """A shift common to every cell (the seeds' shared effect) moves E alone: it widens each
    optimum's draws but not the noise a misfit is measured against."""
    a = arm("k2", TRUE)
    interaction = 0.01 * np.log(a.n / a.n.min()) * np.log(a.d / a.d.min())
    bent = _noisy(a, a.loss - interaction, noise=0.003)
    shared = 0.05 * np.random.default_rng(2).standard_normal((200, 1))
    seeded = dataclasses.replace(bent, draws=bent.draws + shared)
    (fit,) = fit_surface_grid(seeded.n, seeded.d, seeded.loss[None])
    assert co.lack_of_fit_reason(seeded, fit) is not None


def test_the_surface_route_refuses_a_surface_its_lack_of_fit_test_rejects():
    """Optima that gain more from more data the larger the model (K2's cpu_v2 shape): no
    separable L(N, D) fits them, and the route signs no multiplier."""
    a = arm("k2", TRUE)
    interaction = 0.01 * np.log(a.n / a.n.min()) * np.log(a.d / a.d.min())
    bent = _noisy(a, a.loss - interaction, noise=0.003)
    (fit,) = fit_surface_grid(bent.n, bent.d, bent.loss[None])
    assert "misses the cell optima beyond their noise" in co.lack_of_fit_reason(bent, fit)
    other = _noisy(arm("k3", shifted(TRUE, 2.5)), arm("k3", shifted(TRUE, 2.5)).loss, 0.003)
    route = co.compare_arms({"k2": bent, "k3": other}, "k2", decades=1.0).routes["surface"]
    assert "misses the cell optima" in route.arms["k2"].surface.verdict.reason
    assert all(not e.identified for e in route.multiplier["k3"])


def test_the_rate_interval_holds_both_the_percentile_and_the_normal_reading():
    rng = np.random.default_rng(0)
    skewed = rng.gamma(2.0, 0.05, 4000)  # a long right tail
    point = float(np.median(skewed))
    lo, hi = co.rate_interval(skewed, point)
    pct = np.percentile(skewed, [2.5, 97.5])
    spread = (np.percentile(skewed, 84.134) - np.percentile(skewed, 15.866)) / 2
    assert lo == pytest.approx(min(pct[0], point - 1.96 * spread), rel=1e-3)
    assert hi == pytest.approx(max(pct[1], point + 1.96 * spread), rel=1e-3)
    symmetric = rng.standard_normal(20000)
    lo, hi = co.rate_interval(symmetric, 0.0)
    assert (lo, hi) == pytest.approx((-1.96, 1.96), abs=0.05)
    assert co.rate_interval(symmetric[:10], 0.0) is None


# Issue 47: every route earns its number.


def ladder_arm(name, loss_of_c, noise, seed=0):
    """An arm on a k2_vs_k3-like ladder (3 sizes x 3 ratios) whose optima follow `loss_of_c`,
    each seen through independent noise of sd `noise` (the point is one draw)."""
    n = np.repeat([3e4, 7e4, 1.3e5], 3)
    d = n * np.tile([5.0, 10.0, 20.0], 3)
    compute = 6 * n * d
    truth = loss_of_c(compute)
    rng = np.random.default_rng(seed)
    return co.ArmOptima(
        name=name,
        n=n,
        d=d,
        compute=compute,
        loss=truth + noise * rng.standard_normal(len(truth)),
        draws=truth + noise * rng.standard_normal((400, len(truth))),
    )


def power_law(e=2.0, k=3.0, alpha=0.2, at=1.0):
    return lambda c: e + k * (at * c / 1e11) ** -alpha


def test_the_pinned_law_recovers_a_pure_power_law():
    log_c = np.log(np.geomspace(1e10, 1e12, 6))
    loss = 4.0 * np.exp(-0.05 * (log_c - log_c.mean()))
    (e, k, alpha), *_ = co.fit_frontier_grid(log_c, loss[None], np.ones((1, 6), bool), 0.0)
    assert (e, k) == (0.0, pytest.approx(4.0, rel=1e-3))
    assert alpha == pytest.approx(0.05, rel=0.01)  # the grid's 1% step


def test_a_power_law_seen_through_noise_passes_the_law_s_checks():
    a = ladder_arm("k2", power_law(), noise=0.003)
    law = co.arm_frontier(a, "envelope").record.law
    assert law.verdict.identified, law.verdict.reason
    assert law.lack_of_fit.p_value > 0.01
    assert law.draws.shape == (400, 3)


def test_a_frontier_straight_in_log_c_is_refused_on_the_grid_s_end():
    """K2's v3 optima: loss falls linearly in log C, which E + K C^-alpha reaches only as alpha
    goes to 0 and E to minus infinity; the law stops on the grid's end and is refused."""
    straight = ladder_arm("k2", lambda c: 9.0 - 0.2 * np.log(c), noise=0.002)
    law = co.arm_frontier(straight, "envelope").record.law
    assert "sits on an end of its search grid" in law.verdict.reason
    assert law.params["E"] < 0


def test_a_law_that_misses_its_points_beyond_their_noise_is_refused():
    """A frontier that bends the other way halfway (a kink) is no power law at 0.002 noise."""
    kinked = ladder_arm(
        "k2", lambda c: power_law()(c) - 0.15 * np.clip(np.log(c / 3e11), 0, None), 0.002
    )
    for route in ("envelope", "envelope_e0"):
        law = co.arm_frontier(kinked, route).record.law
        assert law.lack_of_fit is not None and law.lack_of_fit.p_value < 0.01
        assert not law.verdict.identified
    # The free law is refused first for its negative asymptote; the pinned one for its misfit.
    assert "misses its Pareto points beyond their noise" in law.verdict.reason


def test_a_refused_law_signs_no_multiplier_or_rate_while_the_monotone_route_reads_on():
    kinked = ladder_arm(
        "k2", lambda c: power_law()(c) - 0.15 * np.clip(np.log(c / 3e11), 0, None), 0.002
    )
    other = ladder_arm("k3", power_law(at=2.0), 0.002, seed=1)
    comparison = co.compare_arms({"k2": kinked, "k3": other}, "k2", decades=1.0)
    envelope = comparison.routes["envelope"]
    assert all(not e.identified for e in envelope.multiplier["k3"])
    assert "frontier law of k2 is refused" in envelope.rate["k3"].verdict.reason
    monotone = comparison.routes["monotone"]
    assert any(e.identified for e in monotone.multiplier["k3"])
    assert monotone.arms["k2"].law is None


def test_the_monotone_frontier_does_not_jump_when_a_point_leaves_the_pareto_set():
    """Issue 47: k2-s3 at 10 tokens per parameter sat 0.005 nats below k2-s2 at 20, at higher
    compute; as it rises past it, it leaves the Pareto set. The law through the Pareto points
    jumps there; the running minimum moves no more than the point did."""
    a = ladder_arm("k2", power_law(), noise=0.0)
    order = np.argsort(a.compute)
    upper, lower = order[5], order[4]  # neighbours in compute
    grid = np.geomspace(a.compute.min(), a.compute.max(), 50)

    def curves(step):
        loss = a.loss.copy()
        loss[upper] = loss[lower] + step  # just below, then just above its cheaper neighbour
        return co.monotone_frontier(a, loss[None], grid)[0]

    below, above = curves(-1e-4), curves(1e-4)
    assert np.nanmax(np.abs(below - above)) <= 2e-4 + 1e-12


def test_the_monotone_frontier_never_rises_and_is_undefined_outside_the_data():
    a = ladder_arm("k2", power_law(), noise=0.02, seed=3)
    grid = np.geomspace(a.compute.min() / 2, a.compute.max() * 2, 80)
    curves = co.monotone_frontier(a, a.draws[:50], grid)
    inside = (grid >= a.compute.min()) & (grid <= a.compute.max())
    assert np.all(np.isnan(curves[:, ~inside]))
    assert np.all(np.diff(curves[:, inside], axis=1) <= 1e-12)


def test_routes_that_pass_agree_on_a_known_multiplier_and_the_agreement_names_them():
    arms = {
        "k2": ladder_arm("k2", power_law(), 0.003),
        "k3": ladder_arm("k3", power_law(at=2.0), 0.003, seed=1),
    }
    comparison = co.compare_arms(arms, "k2", decades=1.0)
    middle = len(comparison.compute) // 2
    for route in ("envelope", "monotone"):
        m = comparison.routes[route].multiplier["k3"][middle]
        assert m.identified, (route, m.verdict.reason)
        assert m.interval[0] < 2.0 < m.interval[1] or m.value == pytest.approx(2.0, rel=0.15)
    agreement = comparison.agreement("k3")[middle]
    assert {"envelope", "monotone"} <= set(agreement["routes"])
    assert agreement["status"] == "agree (intervals overlap)"


def shifted_ladder(name, loss_of_c, sizes, noise=0.0, seed=0):
    """Like `ladder_arm`, on its own sizes (two arms' ladders sit at different computes)."""
    n = np.repeat(sizes, 3)
    d = n * np.tile([5.0, 10.0, 20.0], len(sizes))
    compute = 6 * n * d
    truth = loss_of_c(compute)
    rng = np.random.default_rng(seed)
    return co.ArmOptima(
        name, n, d, compute, truth, truth + noise * rng.standard_normal((400, len(truth)))
    )


@pytest.mark.parametrize("k", [1.0, 2.5])
def test_the_monotone_bounds_hold_the_true_multiplier_between_cells_of_two_ladders(k):
    """Issue 47: with one truth sampled at different computes by the two arms, the cubic's
    reading between cells is off the truth's M; the bounds hold it at every compute they
    bound."""
    base = shifted_ladder("k2", power_law(), [3e4, 7e4, 1.3e5])
    new = shifted_ladder("k3", power_law(at=k), [4.4e4, 9e4, 1.7e5])
    at = co.common_grid([base, new])
    bounds = co.monotone_multiplier_bounds(base, new, base.loss[None], new.loss[None], at)
    both = np.isfinite(bounds.lower[0]) & np.isfinite(bounds.upper[0])
    assert both.sum() >= 5
    assert np.all(bounds.lower[0][both] <= k * (1 + 1e-9))
    assert np.all(bounds.upper[0][both] >= k * (1 - 1e-9))


def brute_force_bounds(base, new, at):
    """The bounds by definition: over the baseline's computes, the cheapest whose running
    minimum reaches the lowest loss the new arm can have at C, and the dearest whose running
    minimum stays above the highest."""

    def running(arm):
        computes = np.unique(arm.compute)
        return computes, np.array([arm.loss[arm.compute <= c].min() for c in computes])

    bc, br = running(base)
    nc, nr = running(new)
    lower, upper = [], []
    for c in at:
        highest = nr[nc <= c * (1 + 1e-12)][-1]
        lowest = nr[nc >= c * (1 - 1e-12)][0]
        reach_low = bc[br <= lowest]
        upper.append(reach_low[0] / c if len(reach_low) else np.nan)
        above_high = bc[br > highest]
        lower.append(above_high[-1] / c if len(above_high) else np.nan)
    return np.array(lower), np.array(upper)


def test_the_monotone_bounds_match_their_definition_on_noisy_optima():
    base = ladder_arm("k2", power_law(), noise=0.02, seed=5)
    new = ladder_arm("k3", power_law(at=2.0), noise=0.02, seed=6)
    at = np.geomspace(base.compute.min(), base.compute.max(), 23)
    bounds = co.monotone_multiplier_bounds(base, new, base.loss[None], new.loss[None], at)
    lower, upper = brute_force_bounds(base, new, at)
    np.testing.assert_allclose(bounds.lower[0], lower, rtol=1e-9)
    np.testing.assert_allclose(bounds.upper[0], upper, rtol=1e-9)


def test_the_monotone_route_s_interval_is_the_bounds_and_its_rate_the_cubic_s():
    base = shifted_ladder("k2", power_law(), [3e4, 7e4, 1.3e5], noise=0.004, seed=1)
    new = shifted_ladder("k3", power_law(), [4.4e4, 9e4, 1.7e5], noise=0.004, seed=2)
    comparison = co.compare_arms({"k2": base, "k3": new}, "k2", decades=1.0)
    route = comparison.routes["monotone"]
    at = np.array(comparison.compute)
    bounds = co.monotone_multiplier_bounds(base, new, base.draws, new.draws, at)
    for j, e in enumerate(route.multiplier["k3"]):
        if e.interval is None:
            continue
        assert e.interval[0] == pytest.approx(np.nanpercentile(bounds.lower[:, j], 2.5))
        assert e.interval[1] == pytest.approx(np.nanpercentile(bounds.upper[:, j], 97.5))
        assert e.interval[0] <= 1.0 <= e.interval[1]  # no effect: never excluded here
    assert route.rate["k3"].value is not None
