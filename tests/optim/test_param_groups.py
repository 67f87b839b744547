"""Optimizer group rules (INTERFACES.md 6) on real layers and a real tiny model."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from torch import nn

from k3scale.config import OptimConfig
from k3scale.models.model import build_model
from k3scale.models.presets import get_preset
from k3scale.optim.muon import build_optimizer
from k3scale.optim.param_groups import build_param_groups, format_param_table

NO_DECAY_1D = {
    "attn_lora.q_a_norm.weight",
    "attn_lora.kv_a_norm.weight",
    "attn_direct.kv_a_norm.weight",
    "attnres.query",
    "attnres.key_norm",
    "moe.latent_norm.weight",
    "final_norm.weight",
}
ADAMW_DECAYED = {"embed.weight", "head.weight"}
PER_HEAD = {
    "attn_lora.q_b_proj.weight": 2,
    "attn_lora.kv_b_proj.weight": 2,
    "attn_direct.q_proj.weight": 4,
    "attn_direct.kv_b_proj.weight": 4,
}
EXPERT_TENSORS = {"moe.w_gate", "moe.w_up", "moe.w_down"}
ROUTER = "moe.router.weight"


def by_name(groups) -> dict:
    return {a.name: a for a in groups.assignments}


def assert_each_parameter_in_exactly_one_group(model: nn.Module, cfg: OptimConfig) -> None:
    optimizer = build_optimizer(model, cfg)
    seen = Counter(id(p) for group in optimizer.param_groups for p in group["params"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert set(seen) == {id(p) for p in trainable}
    assert all(count == 1 for count in seen.values())


@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("router", ["muon", "adamw"])
def test_tiny_stack_rules(make_stack, per_head, router):
    model = make_stack()
    cfg = OptimConfig(per_head_muon=per_head, router_optimizer=router)
    assert_each_parameter_in_exactly_one_group(model, cfg)
    assignments = by_name(build_param_groups(model, cfg))
    assert set(assignments) == {name for name, _ in model.named_parameters()}
    for name, a in assignments.items():
        if name in NO_DECAY_1D:
            assert (a.algorithm, a.weight_decay) == ("adamw", False), name
        elif name in ADAMW_DECAYED:
            assert (a.algorithm, a.weight_decay) == ("adamw", True), name
        elif name == ROUTER:
            assert (a.algorithm, a.weight_decay) == (router, True), name
        else:
            assert (a.algorithm, a.weight_decay) == ("muon", True), name
        expected_heads = PER_HEAD.get(name) if per_head else None
        assert a.num_heads == expected_heads, name
    assert all(assignments[name].shape[0] == 4 for name in EXPERT_TENSORS)


def test_optimizer_groups_carry_weight_decay_and_heads(make_stack):
    cfg = OptimConfig(weight_decay=0.07, per_head_muon=True)
    groups = build_optimizer(make_stack(), cfg).param_groups
    names = {g["name"]: g for g in groups}
    assert set(names) == {"muon", "muon/heads=2", "muon/heads=4", "adamw", "adamw/no_wd"}
    assert names["adamw/no_wd"]["weight_decay"] == 0.0
    assert {names[n]["weight_decay"] for n in names if n != "adamw/no_wd"} == {0.07}
    assert names["muon/heads=4"]["num_heads"] == 4
    assert len(names["adamw/no_wd"]["params"]) == len(NO_DECAY_1D)


def test_decay_parameters_and_conv_kernels():
    """The KDA naming rules of INTERFACES.md 1 on a hand-built module (torch layers only)."""
    module = nn.Module()
    module.A_log = nn.Parameter(torch.zeros(4))
    module.dt_bias = nn.Parameter(torch.zeros(32))
    module.q_conv = nn.Conv1d(32, 32, 4, groups=32, bias=False)  # weight [32, 1, 4]
    module.k_conv = nn.Parameter(torch.zeros(32, 1, 4))  # a bare kernel parameter
    module.b_proj = nn.Linear(16, 4)
    module.column = nn.Module()
    module.column.A_log = nn.Parameter(torch.zeros(4, 1))  # the name rule, not the 1-D rule
    assignments = by_name(build_param_groups(module, OptimConfig()))
    for name in ("A_log", "dt_bias", "b_proj.bias", "column.A_log"):
        assert (assignments[name].algorithm, assignments[name].weight_decay) == ("adamw", False)
    for name in ("q_conv.weight", "k_conv"):
        assert (assignments[name].algorithm, assignments[name].weight_decay) == ("adamw", True)
    assert assignments["b_proj.weight"].algorithm == "muon"


def test_uncovered_shapes_and_bad_head_counts_raise():
    module = nn.Module()
    module.odd = nn.Parameter(torch.zeros(2, 2, 2, 2))
    with pytest.raises(ValueError, match="odd"):
        build_param_groups(module, OptimConfig())
    heads = nn.Module()
    heads.q_proj = nn.Linear(8, 10)
    heads.per_head_projections = {"q_proj": 3}
    with pytest.raises(ValueError, match="q_proj"):
        build_param_groups(heads, OptimConfig(per_head_muon=True))


def test_frozen_parameters_get_no_group(make_stack):
    model = make_stack()
    model.head.weight.requires_grad_(False)
    assert "head.weight" not in by_name(build_param_groups(model, OptimConfig()))
    assert_each_parameter_in_exactly_one_group(model, OptimConfig())


def test_table_lists_every_parameter(make_stack):
    model = make_stack()
    groups = build_param_groups(model, OptimConfig(per_head_muon=True))
    table = format_param_table(groups)
    lines = table.splitlines()
    assert lines[0].split() == ["parameter", "shape", "optimizer", "wd", "heads", "rule"]
    listed = [line.split()[0] for line in lines[1 : 1 + len(groups.assignments)]]
    assert listed == [name for name, _ in model.named_parameters()]
    numel = sum(p.numel() for p in model.parameters())
    footer = {line.split(":")[0]: line for line in lines[-2:]}
    counted = sum(int(footer[k].split(", ")[1].split()[0].replace(",", "")) for k in footer)
    assert counted == numel


def check_real_model(model: nn.Module, cfg: OptimConfig) -> None:
    """Rules that hold for any built model, checked by name and shape."""
    assert_each_parameter_in_exactly_one_group(model, cfg)
    assignments = by_name(build_param_groups(model, cfg))
    for name, param in model.named_parameters():
        a = assignments[name]
        leaf = name.rpartition(".")[2]
        no_decay = param.ndim == 1 or leaf in ("A_log", "dt_bias")
        assert a.weight_decay == (not no_decay), name
        if no_decay or name in ("embed.weight", "head.weight") or "_conv" in name:
            assert a.algorithm == "adamw", name
        elif ".router." not in name:
            assert a.algorithm == "muon", name
    marked = 0
    for module_name, module in model.named_modules():
        for child, heads in getattr(module, "per_head_projections", {}).items():
            assert assignments[f"{module_name}.{child}.weight"].num_heads == heads
            marked += 1
    assert marked > 0


def test_k2_tiny_preset_with_mtp():
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(get_preset("k2-t0"), mtp_depth=1))
    check_real_model(model, OptimConfig(per_head_muon=True))


def test_k3_tiny_preset():
    pytest.importorskip(
        "k3scale.models.kda", reason="KDA layer (k3scale/models/kda.py) not built yet"
    )
    torch.manual_seed(0)
    model = build_model(get_preset("k3-t0"))
    check_real_model(model, OptimConfig(per_head_muon=True))
    names = {name.rpartition(".")[2] for name, _ in model.named_parameters()}
    assert {"A_log", "dt_bias", "query", "key_norm"} <= names
