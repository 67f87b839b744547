"""Accounting: exact parameter counts vs built models, full-scale integers, FLOP conventions."""

from __future__ import annotations

import dataclasses
import random
from fractions import Fraction

import pytest

from k3scale.models import accounting
from k3scale.models.config import K2Config, K3Config, KDAConfig, MLAConfig, MoEConfig
from k3scale.models.presets import get_preset


def _random_mla(rng: random.Random, k3: bool) -> MLAConfig:
    return MLAConfig(
        num_heads=rng.randint(1, 3),
        q_lora_rank=rng.choice([None, rng.randint(2, 12)]),
        kv_lora_rank=rng.randint(2, 12),
        d_nope=rng.choice([4, 6]),
        d_rope=rng.choice([2, 4]) if not k3 else rng.choice([0, 2, 4]),
        d_v=rng.choice([3, 4, 8]),
        rope=not k3,
        output_gate=k3 and rng.random() < 0.7,
    )


def _random_moe(rng: random.Random, d_model: int) -> MoEConfig | None:
    if rng.random() < 0.3:
        return None
    num_experts = rng.randint(2, 6)
    return MoEConfig(
        num_experts=num_experts,
        top_k=rng.randint(1, num_experts),
        num_shared=rng.randint(0, 2),
        d_expert=rng.randint(2, 10),
        d_latent=rng.choice([None, max(2, d_model // 2)]),
        latent_norm=rng.random() < 0.5,
        balancing=rng.choice(["loss_free", "quantile", "none"]),
        seq_aux_alpha=rng.choice([0.0, 1e-4]),
    )


def random_config(rng: random.Random, family: str) -> K2Config | K3Config:
    """A small random config exercising every optional part of the family."""
    d_model = rng.choice([8, 12, 16])
    num_layers = rng.randint(1, 6)
    common = {
        "vocab_size": rng.randint(20, 60),
        "d_model": d_model,
        "num_layers": num_layers,
        "d_ff_dense": rng.randint(4, 24),
        "moe": _random_moe(rng, d_model),
        "num_dense_layers": rng.randint(0, num_layers),
        "mtp_depth": rng.choice([0, 0, 1, 2]),
    }
    if family == "k2":
        return K2Config(mla=_random_mla(rng, k3=False), **common)
    kda = KDAConfig(
        num_heads=rng.randint(1, 3),
        d_head=rng.choice([4, 8]),
        conv_size=rng.randint(1, 4),
        output_gate=rng.choice(["full", "low_rank"]),
        output_gate_bias=rng.random() < 0.5,
        chunk_size=8,
    )
    return K3Config(
        mla=_random_mla(rng, k3=True),
        kda=kda,
        mla_period=rng.randint(1, 4),
        attnres=rng.random() < 0.6,
        attnres_block_size=rng.randint(1, 3),
        mtp_mixer=rng.choice(["kda", "mla"]),
        **common,
    )


def _numel(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _active_numel(model, cfg) -> int:
    """Active count from the built model: drop the embedding and the unused routed experts."""
    from k3scale.models.model import moe_modules

    total = _numel(model) - model.embed.weight.numel()
    for moe in moe_modules(model):
        per_expert = sum(w[0].numel() for w in (moe.w_gate, moe.w_up, moe.w_down))
        total -= (cfg.moe.num_experts - cfg.moe.top_k) * per_expert
    return total


@pytest.mark.parametrize("family", ["k2", "k3"])
def test_counts_equal_built_parameters_for_random_configs(family):
    from k3scale.models.model import build_model

    rng = random.Random(1234 if family == "k2" else 4321)
    for _ in range(25):
        cfg = random_config(rng, family)
        model = build_model(cfg)
        assert accounting.num_params_total(cfg) == _numel(model), cfg
        assert accounting.num_params_active(cfg) == _active_numel(model, cfg), cfg


def test_breakdown_sums_to_totals():
    cfg = get_preset("k3-t2")
    assert sum(accounting.param_breakdown(cfg).values()) == accounting.num_params_total(cfg)
    active = accounting.param_breakdown(cfg, active=True)
    assert active["embed"] == 0
    assert sum(active.values()) == accounting.num_params_active(cfg)


def test_full_scale_integers():
    k3, k2 = get_preset("kimi-k3"), get_preset("kimi-k2")
    # architecture.md section 10.2 (matches K3 Table 1: 2.78 T total, 104.2 B active).
    assert accounting.num_params_total(k3) == 2_779_484_393_568
    assert accounting.num_params_active(k3) == 104_189_530_208
    assert accounting.num_params_total(k2) == 1_026_408_209_408
    assert accounting.num_params_active(k2) == 31_687_072_768
    assert accounting.param_breakdown(k3)["attnres"] == 2_680_832
    assert accounting.kda_params(7168, k3.kda) == 443_740_384
    assert accounting.mla_params(7168, k3.mla) == 232_196_096
    assert accounting.mla_params(7168, k2.mla) == 101_124_096
    moe = accounting.moe_breakdown(7168, k3.moe, active=False)
    assert sum(moe.values()) == 29_784_935_936
    assert sum(accounting.moe_breakdown(7168, k3.moe, active=True).values()) == 718_409_216


def test_full_scale_flops_match_section_11():
    k2, k3 = get_preset("kimi-k2"), get_preset("kimi-k3")
    b2, b3 = accounting.flops_breakdown(k2, 4096), accounting.flops_breakdown(k3, 4096)
    # Section 11 table at T = 4096: K2 190.1 GF + 15.4 GF, K3 625.1 GF + 12.7 GF.
    assert accounting.flops_per_token_6n(k2) == 6 * 31_687_072_768
    assert b2["mla_core"] == 3 * 61 * 64 * (192 + 128) * 4097
    assert round(float(b3["mla_core"] + b3["kda_core"]) / 1e9, 1) == 12.7
    assert accounting.flops_per_token(k2, 4096) == 6 * 31_687_072_768 + 3 * 61 * 64 * 320 * 4097


def test_kda_core_per_head_values_of_section_11():
    one_head = KDAConfig(num_heads=1, d_head=128, chunk_size=64)
    # Section 11: h = 128, C = 64 gives 181,589 (dense chunk) and 126,976 (Eq. 13) per head.
    assert accounting.kda_core_flops(one_head, 4096) == Fraction(181_589 * 3 + 1, 3)
    eq13 = dataclasses.replace(one_head, flops_convention="kimi_linear_eq13")
    assert accounting.kda_core_flops(eq13, 4096) == 126_976


def test_kda_core_counts_a_short_last_chunk():
    kda = KDAConfig(num_heads=2, d_head=4, chunk_size=8)
    seq_len = 11  # one chunk of 8 and one of 3
    per_chunk = [6 * c * 16 + 10 * c * c * 4 + Fraction(c**3, 3) for c in (8, 3)]
    assert accounting.kda_core_flops(kda, seq_len) == 2 * sum(per_chunk) / seq_len


def test_flops_total_rounds_once_and_includes_mtp_head():
    cfg = dataclasses.replace(get_preset("k3-t1"), mtp_depth=1)
    parts = accounting.flops_breakdown(cfg, 100)
    assert parts["mtp_head"] == 6 * cfg.vocab_size * cfg.d_model
    assert accounting.flops_per_token(cfg, 100) == round(sum(parts.values()))
    assert accounting.flops_per_token(cfg, 100) > accounting.flops_per_token_6n(cfg)


def test_mtp_params_counted_when_on():
    off = get_preset("k2-t1")
    on = dataclasses.replace(off, mtp_depth=2)
    extra = accounting.num_params_total(on) - accounting.num_params_total(off)
    assert extra == 2 * accounting.mtp_block_params(off)
    assert accounting.param_breakdown(on)["mtp"] == extra


def test_layer_layout():
    assert accounting.layer_layout(get_preset("kimi-k3")).split(" ")[-2:] == ["KKKM", "M"]
    assert accounting.layer_layout(get_preset("k2-t3")) == "MMMM"
    k3 = dataclasses.replace(get_preset("k3-t3"), num_layers=10)
    assert accounting.layer_layout(k3) == "KKKM KKKM KM"


def test_bad_seq_len_is_rejected():
    with pytest.raises(ValueError, match="seq_len"):
        accounting.flops_per_token(get_preset("k2-t0"), 0)


def _meta_numel(cfg) -> int:
    """Parameter count of the built model, on the meta device (no memory, no init cost)."""
    import torch

    from k3scale.models.model import build_model

    with torch.device("meta"):
        model = build_model(cfg)
    return _numel(model)


@pytest.mark.parametrize("family", ["k2", "k3"])
def test_every_ladder_preset_builds_with_the_counted_size(family):
    from k3scale.models.presets import ladder

    for name in ladder(family):
        cfg = get_preset(name)
        assert _meta_numel(cfg) == accounting.num_params_total(cfg), name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kimi-k2", "kimi-k3"])
def test_full_scale_model_builds_with_the_counted_size(name):
    cfg = get_preset(name)
    assert _meta_numel(cfg) == accounting.num_params_total(cfg)


def test_with_active_params_sets_the_width_nearest_the_target():
    cfg = get_preset("k3-s1", ["mla_period=1"])
    target = accounting.num_params_active(get_preset("k3-s1"))
    matched = accounting.with_active_params(cfg, "d_ff_dense", target)
    step = 3 * cfg.d_model * cfg.num_dense_layers
    assert abs(accounting.num_params_active(matched) - target) <= step / 2
    for other in (matched.d_ff_dense - 1, matched.d_ff_dense + 1):
        moved = dataclasses.replace(matched, d_ff_dense=other)
        assert abs(accounting.num_params_active(moved) - target) >= abs(
            accounting.num_params_active(matched) - target
        )
    # Already at the target: unchanged.
    same = accounting.with_active_params(get_preset("k3-s1"), "d_ff_dense", target)
    assert same == get_preset("k3-s1")
