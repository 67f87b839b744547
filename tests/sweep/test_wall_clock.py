"""The wall-clock model of `k3scale study plan`, checked against the studies it was fitted to.

Each committed study recorded its busy trial time (study.json); the model, at the peak those
runs measured (scale 1), must land within a factor of two of it. That is the accuracy the plan's
"about N min" claims, no more: small runs (the demo presets) spend more time outside training
steps than the per-token terms capture.
"""

from __future__ import annotations

import json

import pytest

from k3scale.sweep.declaration import load_study
from k3scale.sweep.planner import MEASURED_STUDIES, estimate_wall_s, measured_throughput


@pytest.fixture(scope="module")
def model():
    fitted = measured_throughput()
    assert fitted is not None and fitted.num_runs > 100
    return fitted


@pytest.mark.parametrize(
    "folder", sorted(p.name for p in MEASURED_STUDIES.glob("*") if (p / "study.json").is_file())
)
def test_model_is_within_a_factor_two_of_each_recorded_study(model, folder):
    record = json.loads((MEASURED_STUDIES / folder / "study.json").read_text())
    study = load_study(MEASURED_STUDIES.parents[1] / "experiments" / f"{record['study']}.py")
    preset = study.preset(record["preset"])
    busy = estimate_wall_s(study, preset, model, model.peak_flops, slots=1)
    assert 0.5 < busy / record["busy_trial_s"] < 2.0, (busy, record["busy_trial_s"])


def test_a_faster_machine_and_more_slots_shorten_the_estimate(model):
    study = load_study(MEASURED_STUDIES.parents[1] / "experiments" / "k2_vs_k3.py")
    preset = study.preset("smoke")
    base = estimate_wall_s(study, preset, model, model.peak_flops, slots=1)
    assert estimate_wall_s(study, preset, model, 2 * model.peak_flops, slots=2) == pytest.approx(
        base / 4
    )
