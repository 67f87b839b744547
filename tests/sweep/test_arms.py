"""Arms: named variants of a family (issue 38's ablation arms), declared, planned and trained.

Each arm's trial is its family's trial with the arm's switches and nothing else (but the width
that gives a matched arm its family's active parameters); every arm of
experiments/k3_ablations.py builds a model that trains a step; AdamW on every matrix leaves no
parameter to Muon; a default config's hash is what it was before the optimizer switch existed.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from k3scale.config import apply_overrides, config_hash, identity_dict
from k3scale.errors import K3ScaleError
from k3scale.models import accounting, build_model
from k3scale.optim.muon import build_optimizer
from k3scale.optim.param_groups import build_param_groups
from k3scale.sweep.declaration import Arm, Study, load_study
from k3scale.sweep.planner import Cell, plan_cells, trial_config

ROOT = Path(__file__).resolve().parents[2]
ABLATIONS = load_study(ROOT / "experiments" / "k3_ablations.py")
SMOKE = ABLATIONS.preset("smoke")


def _config(arch: str, size: str = "k3-t0"):
    cell = Cell(arch=arch, size=size, budget_tokens=16_384, schedule="cosine")
    return trial_config(
        ABLATIONS,
        SMOKE,
        cell,
        lr=1e-2,
        batch_size=8,
        seed=0,
        out_dir="runs/x",
        data_root="data",
        tracking_uri=None,
        tags={},
    )


@pytest.mark.parametrize("arm", ABLATIONS.arms, ids=lambda a: a.name)
def test_an_arm_is_its_family_s_trial_with_its_switches_and_nothing_else(arm):
    base, own = _config("k3"), _config(arm.name)
    switched = apply_overrides(base, arm.overrides)
    if arm.matched_by:
        width = arm.matched_by.removeprefix("model.")
        switched = apply_overrides(switched, [f"model.{width}={getattr(own.model, width)}"])
    assert identity_dict(own) == identity_dict(switched)
    assert config_hash(own) != config_hash(base), f"{arm.name} switches nothing"
    assert dict(own.track.tags)["k3scale.arch"] == arm.name


@pytest.mark.parametrize("arm", ABLATIONS.arms, ids=lambda a: a.name)
def test_every_ablation_arm_builds_a_model_that_trains_a_step(arm):
    cfg = _config(arm.name)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    optimizer = build_optimizer(model, cfg.optim)
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 17))
    loss = model(tokens[:, :-1], targets=tokens[:, 1:]).loss
    loss.backward()
    optimizer.step()
    assert math.isfinite(loss.item())


@pytest.mark.parametrize("rung", ["s1", "s2", "t0"])
def test_a_matched_arm_keeps_its_family_s_active_parameters_at_every_rung(rung):
    """The cpu preset's arms that change N get it back in the dense FFN: within one width step
    (48-72 parameters at s1-s2) of full K3's, where unmatched mla_only sat 5-7% below."""
    size = f"k3-{rung}"
    full = accounting.num_params_active(_config("k3", size).model)
    width_step = 3 * _config("k3", size).model.d_model  # a dense GLU: gate, up and down
    for arm in ABLATIONS.arms:
        model = _config(arm.name, size).model
        unmatched = apply_overrides(_config("k3", size), arm.overrides).model
        if arm.matched_by:
            assert abs(accounting.num_params_active(model) - full) <= width_step / 2, arm.name
        else:
            assert accounting.num_params_active(unmatched) == full, f"{arm.name} changes N"
    if rung != "t0":  # at t0 the vocab-32k head is most of N
        mla_only = apply_overrides(_config("k3", size), ("model.mla_period=1",)).model
        assert accounting.num_params_active(mla_only) < 0.95 * full


def test_matching_by_a_width_that_does_not_count_is_one_clear_error():
    arm = Arm(name="odd", base="k3", overrides=("model.attnres=false",), matched_by="model.rms_eps")
    preset = dataclasses.replace(SMOKE, sizes={"k3": ("k3-t0",), "odd": ("k3-t0",)})
    study = dataclasses.replace(
        ABLATIONS, archs=("k3", "odd"), arms=(arm,), presets={"smoke": preset}
    )
    with pytest.raises(K3ScaleError, match=r"arm odd: model\.rms_eps: does not change"):
        plan_cells(study, preset)


def test_adamw_on_every_matrix_leaves_nothing_to_muon():
    cfg = _config("adamw")
    groups = build_param_groups(build_model(cfg.model), cfg.optim)
    assert {a.algorithm for a in groups.assignments} == {"adamw"}
    muon = build_param_groups(build_model(cfg.model), _config("k3").optim)
    assert "muon" in {a.algorithm for a in muon.assignments}


def test_the_optimizer_switch_leaves_every_earlier_hash_as_it_was():
    """A field added after runs were hashed is in the hash only away from its default."""
    cfg = _config("k3")
    assert "matrix_optimizer" not in identity_dict(cfg)["optim"]
    switched = dataclasses.replace(
        cfg, optim=dataclasses.replace(cfg.optim, matrix_optimizer="adamw")
    )
    assert identity_dict(switched)["optim"]["matrix_optimizer"] == "adamw"


def test_arm_cells_are_keyed_by_arm_and_keep_their_family_s_ladder():
    cells = plan_cells(ABLATIONS, SMOKE)
    keys = [c.key for c in cells]
    assert len(set(keys)) == len(keys) == len(ABLATIONS.archs)
    arm_cells = [c for c in cells if c.arch not in ("k2", "k3")]
    assert all(c.key.startswith(f"{c.arch}@k3-t0|") and c.family == "k3" for c in arm_cells)
    assert {c.key for c in cells if c.arch == "k3"} == {"k3-t0|D16384|cosine"}


def test_a_bad_arm_is_one_clear_error():
    with pytest.raises(K3ScaleError, match="not a family"):
        Arm(name="k3", base="k3")
    typo = Arm(name="typo", base="k3", overrides=("model.attnress=false",))
    preset = dataclasses.replace(SMOKE, sizes={"k3": ("k3-t0",), "typo": ("k3-t0",)})
    study = dataclasses.replace(
        ABLATIONS, archs=("k3", "typo"), arms=(typo,), presets={"smoke": preset}
    )
    with pytest.raises(K3ScaleError, match=r"arm typo: .*unknown key 'attnress'"):
        plan_cells(study, preset)
    with pytest.raises(K3ScaleError, match="under arch 'wrong'"):
        Study(
            name="s",
            archs=("wrong",),
            arms=(Arm(name="wrong", base="k2"),),
            schedules=("cosine",),
            presets={"p": dataclasses.replace(SMOKE, sizes={"wrong": ("k3-t0",)})},
        )
