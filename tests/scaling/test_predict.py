"""Laws as predictors (issue 47 item 3): a fit artifact predicts runs it has not seen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from k3scale.scaling import predict
from k3scale.scaling.estimates import compute_optimal as co
from k3scale.scaling.values.fitdoc import CellOptimumRecord, LawRecord
from k3scale.scaling.values.uncertainty import Estimate
from k3scale.scaling.values.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]
V3_FIT = ROOT / "analysis/results/k2_vs_k3-cpu_v3/fit.json"


def law(e=2.0, k=3.0, alpha=0.2, spread=0.0, draws=400) -> LawRecord:
    rng = np.random.default_rng(0)
    params = np.array([e, k, alpha])
    return LawRecord(
        form="test",
        pinned_e=None,
        params={"E": e, "K": k, "alpha": alpha},
        log_c_ref=np.log(1e11),
        compute_range=(1e10, 1e12),
        verdict=Verdict(),
        points=6,
        lack_of_fit=None,
        draws=params + spread * rng.standard_normal((draws, 3)) * [1, 0, 0],
    )


def test_a_law_predicts_its_own_value_with_a_new_run_s_interval():
    got = predict.law_loss(law(), 4e12, sd=0.02)
    expected = 2.0 + 3.0 * 40.0**-0.2
    assert got.value == pytest.approx(expected, rel=1e-12)
    assert got.extrapolation == pytest.approx(4.0)
    lo, hi = got.interval
    # A law known exactly leaves only the new run's noise: +-1.96 sd, to Monte Carlo error.
    assert (hi - lo) / 2 == pytest.approx(1.96 * 0.02, rel=0.08)
    assert lo < expected < hi


def test_the_multiplier_of_two_laws_holds_beyond_the_data():
    """A law at k times the compute of the baseline's is worth k at every compute."""
    base = law()
    new = law(k=3.0 * 2.5**-0.2)  # L_new(C) = L_base(2.5 C)
    for compute in (1e11, 1e13):
        got = predict.law_multiplier(base, new, compute)
        assert got.value == pytest.approx(2.5, rel=1e-9)
        assert got.verdict.identified


def test_a_refused_law_still_predicts_and_says_it_is_refused():
    refused = LawRecord(**{**law().__dict__, "verdict": Verdict("its exponent sits on an end")})
    got = predict.law_multiplier(refused, law(), 1e12)
    assert got.value is not None
    assert "baseline's law is refused" in got.verdict.reason


def optimum(n, d, loss, lr, half=0.02) -> CellOptimumRecord:
    return CellOptimumRecord(
        cell={"arch": "k3", "size": "x", "budget_tokens": d, "schedule": "wsd"},
        n=n,
        tokens=d,
        compute={"c_6n": 6 * n * d},
        loss=Estimate(loss, [loss - half, loss + half], Verdict()),
        lr_opt=lr,
        batch_opt=1792.0,
        mode="1d",
        trials=4,
        best_trial={},
        seed_losses=[],
    )


def ladder(loss_of, lr_of):
    cells = [(n, n * r) for n in (3e4, 7e4, 1.3e5) for r in (5, 10, 20)]
    return [optimum(n, d, loss_of(n, d), lr_of(n, d)) for n, d in cells]


def test_the_lr_law_recovers_a_power_law_in_n_and_d():
    cells = ladder(lambda n, d: 4.0, lambda n, d: 0.3 * n**-0.4 * d**0.1)
    got = predict.hp_prediction(cells, "lr_opt", 2.6e5, 2.6e6, reach=2.0)
    assert got.value == pytest.approx(0.3 * 2.6e5**-0.4 * 2.6e6**0.1, rel=1e-6)
    assert got.interval[0] <= got.value <= got.interval[1]


def test_a_batch_that_was_not_searched_is_said_to_be_fixed():
    cells = ladder(lambda n, d: 4.0, lambda n, d: 0.01)
    got = predict.hp_prediction(cells, "batch_opt", 2.6e5, 2.6e6, reach=2.0)
    assert "fixed, not searched" in got.verdict.reason


def test_the_log_linear_surface_extrapolates_its_own_form_and_flags_a_misfit():
    form = lambda n, d: 9.0 - 0.2 * np.log(n) - 0.3 * np.log(d) + 0.01 * np.log(n) * np.log(d)  # noqa: E731
    cells = ladder(form, lambda n, d: 0.01)
    got = predict.loglinear_loss(cells, 2.6e5, 5.2e6, sd=0.02, reach=2.0)
    assert got.value == pytest.approx(form(2.6e5, 5.2e6), rel=1e-9)
    assert got.verdict.identified
    bumpy = [
        optimum(c.n, c.tokens, c.loss.value + (0.1 if i % 2 else -0.1), 0.01, half=0.01)
        for i, c in enumerate(cells)
    ]
    assert (
        "misses its cells" in predict.loglinear_loss(bumpy, 2.6e5, 5.2e6, 0.02, 2.0).verdict.reason
    )


def test_a_committed_fit_round_trips_its_laws_and_predicts_what_it_fitted():
    """The stored law, read back from the artifact, gives the curve the fit drew at its own
    computes (to the stored digits)."""
    doc = json.loads(V3_FIT.read_text())
    comparison, arms = predict.arm_laws(doc, "c_6n")
    for name, arm in arms.items():
        record = comparison.routes["envelope"].arms[name]
        curve = record.curve
        for c, loss in zip(curve.compute, curve.loss, strict=True):
            if loss is not None:
                got = predict.law_loss(arm.laws["envelope"], c, sd=0.02).value
                assert got == pytest.approx(loss, rel=1e-5)
        assert arm.laws["envelope"].draws.shape[1] == 3


def test_the_stored_draws_reproduce_the_route_s_draws():
    """Storing keeps STORED_DRAWS of the bootstrap draws at 7 digits."""
    a = co.ArmOptima(
        name="k2",
        n=np.repeat([3e4, 7e4, 1.3e5], 3),
        d=np.repeat([3e4, 7e4, 1.3e5], 3) * np.tile([5.0, 10.0, 20.0], 3),
        compute=6 * np.repeat([3e4, 7e4, 1.3e5], 3) ** 2 * np.tile([5.0, 10.0, 20.0], 3),
        loss=np.linspace(4.5, 3.6, 9),
        draws=np.linspace(4.5, 3.6, 9) + 0.01 * np.random.default_rng(0).standard_normal((500, 9)),
    )
    record = co.arm_frontier(a, "envelope").record.law
    back = LawRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert back.draws.shape == (400, 3)
    np.testing.assert_allclose(back.draws, record.draws[:400], rtol=1e-6)


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k3scale.cli", "predict", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_the_predict_command_prints_refusals_and_writes_json(tmp_path):
    out = tmp_path / "p.json"
    result = run_cli(
        str(V3_FIT), "--compute", "4.5e12", "--cell", "k3:249800:4996000", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert "refused (" in result.stdout
    assert "peak LR" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["arms"]["k3"]["frontier"][0]["envelope"]["extrapolation"] > 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("missing.json", "--compute", "1e12"), "no fit artifact"),
        ((str(V3_FIT),), "give at least one"),
        ((str(V3_FIT), "--cell", "k3:1"), "--cell wants ARM:N:D"),
        ((str(V3_FIT), "--cell", "k9:1:2"), "no arm k9"),
        ((str(V3_FIT), "--compute", "-1"), "positive"),
    ],
)
def test_bad_input_to_predict_is_one_line_and_exit_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
