"""Arms: named variants of a family (issue 38's ablation arms), declared, planned and trained.

Each arm's trial is its family's trial with the arm's switches and nothing else; every arm of
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
from k3scale.models import build_model
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
    assert identity_dict(own) == identity_dict(apply_overrides(base, arm.overrides))
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
