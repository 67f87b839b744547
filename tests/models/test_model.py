"""Model assembly: causality, AttnRes equivalence at zero queries, losses, MoE and MLA helpers."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from k3scale.models import accounting, build_model
from k3scale.models.config import K2Config, K3Config, KDAConfig, MLAConfig, MoEConfig
from k3scale.models.ffn import GLUFeedForward
from k3scale.models.model import ModelOutput, mla_modules, moe_modules
from k3scale.models.presets import get_preset


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative RMS error ||a - b||_rms / ||b||_rms."""
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def small_k3(**changes) -> K3Config:
    """Five layers (KKKMM), two AttnRes blocks of 2, MoE after layer 0, tiny vocab."""
    cfg = K3Config(
        vocab_size=64,
        d_model=16,
        num_layers=5,
        kda=KDAConfig(num_heads=2, d_head=8, chunk_size=4),
        mla=MLAConfig(
            num_heads=2, kv_lora_rank=8, d_nope=8, d_rope=4, d_v=8, rope=False, output_gate=True
        ),
        d_ff_dense=32,
        moe=MoEConfig(
            num_experts=4, top_k=2, num_shared=2, d_expert=8, d_latent=8, balancing="quantile"
        ),
        attnres_block_size=2,
    )
    return dataclasses.replace(cfg, **changes)


def small_k2(**changes) -> K2Config:
    cfg = K2Config(
        vocab_size=64,
        d_model=16,
        num_layers=3,
        mla=MLAConfig(num_heads=2, q_lora_rank=8, kv_lora_rank=8, d_nope=8, d_rope=4, d_v=8),
        d_ff_dense=32,
        moe=MoEConfig(num_experts=4, top_k=2, d_expert=8, seq_aux_alpha=1e-2),
    )
    return dataclasses.replace(cfg, **changes)


@pytest.mark.parametrize("make", [small_k2, small_k3], ids=["k2", "k3"])
def test_whole_model_is_causal(make):
    torch.manual_seed(0)
    model = build_model(make())
    tokens = torch.randint(0, 64, (2, 13))
    cut = 6
    changed = tokens.clone()
    changed[:, cut + 1 :] = (tokens[:, cut + 1 :] + 1 + torch.randint(0, 60, (2, 6))) % 64
    with torch.no_grad():
        before, after = model(tokens).logits, model(changed).logits
    torch.testing.assert_close(after[:, : cut + 1], before[:, : cut + 1], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(after[:, cut + 1 :], before[:, cut + 1 :])


def test_attnres_with_zero_queries_equals_plain_residual_model():
    torch.manual_seed(1)
    # Scale invariance of the next RMSNorm is exact only as eps -> 0 (architecture.md 4.1).
    cfg = small_k3(rms_eps=1e-12)
    with_attnres = build_model(cfg)
    for name, param in with_attnres.named_parameters():
        if name.endswith("key_norm"):
            param.data.uniform_(0.5, 1.5)  # irrelevant while the queries are zero
    plain = build_model(dataclasses.replace(cfg, attnres=False))
    loaded = plain.load_state_dict(with_attnres.state_dict(), strict=False)
    assert loaded.missing_keys == []
    assert loaded.unexpected_keys and all("site" in k for k in loaded.unexpected_keys)
    tokens = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        reference = plain(tokens).logits
        assert rel_rms(with_attnres(tokens).logits, reference) < 1e-5
        for site in (with_attnres.layers[3].ffn_site, with_attnres.output_site):
            site.query.normal_()
        assert rel_rms(with_attnres(tokens).logits, reference) > 1e-3


@pytest.mark.parametrize("name", ["k2-t0", "k3-t0", "k2-t1", "k3-t1"])
def test_tiny_presets_train_step(name):
    torch.manual_seed(2)
    cfg = get_preset(name)
    model = build_model(cfg)
    window = torch.randint(0, cfg.vocab_size, (2, 17))
    out = model(window[:, :-1], targets=window[:, 1:])
    assert isinstance(out, ModelOutput) and out.mtp_loss is None
    assert out.logits.shape == (2, 16, cfg.vocab_size)
    # Small init: the first loss is close to the uniform-prediction loss ln V.
    assert abs(out.ce_loss.item() - math.log(cfg.vocab_size)) < 0.05
    aux = sum(m.aux_loss.item() for m in moe_modules(model))
    assert out.loss.item() == pytest.approx(out.ce_loss.item() + aux, rel=1e-6)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is None or torch.isfinite(g).all() for g in grads.values())
    for key in ("embed.weight", "head.weight", "layers.0.attn_norm.weight"):
        assert grads[key] is not None and grads[key].abs().sum() > 0
    # Only the layer-0 mixer AttnRes site may see no gradient (its input is the bare embedding).
    missing = {n for n, g in grads.items() if g is None}
    assert missing <= {"layers.0.mixer_site.query", "layers.0.mixer_site.key_norm"}


@pytest.mark.parametrize("make", [small_k2, small_k3])
def test_training_path_without_logits_gives_the_same_loss_and_gradients(make):
    """`with_logits=False` (chunked head cross-entropy) equals the logits path, in fp64."""
    torch.manual_seed(4)
    model = build_model(make()).double()
    window = torch.randint(0, 64, (3, 12))
    results = []
    for with_logits in (True, False):
        model.zero_grad(set_to_none=True)
        out = model(window[:, :-1], targets=window[:, 1:], with_logits=with_logits)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out, grads))
    (with_logits, grads_ref), (without, grads) = results
    assert without.logits is None and with_logits.logits is not None
    assert rel_rms(without.ce_loss, with_logits.ce_loss) < 1e-12
    assert grads.keys() == grads_ref.keys()
    for name, grad in grads.items():
        # Some AttnRes key-norm gradients are exactly zero at zero queries: absolute floor.
        torch.testing.assert_close(grad, grads_ref[name], rtol=1e-10, atol=1e-14, msg=name)


def test_no_targets_gives_no_losses():
    model = build_model(small_k2())
    out = model(torch.randint(0, 64, (1, 5)))
    assert out.loss is None and out.ce_loss is None and out.mtp_loss is None


def test_sequence_aux_loss_enters_the_training_loss():
    torch.manual_seed(3)
    model = build_model(small_k2())
    window = torch.randint(0, 64, (2, 9))
    out = model(window[:, :-1], targets=window[:, 1:])
    aux = [m.aux_loss.item() for m in moe_modules(model)]
    assert len(aux) == 2 and min(aux) > 0
    assert (out.loss - out.ce_loss).item() == pytest.approx(sum(aux), rel=1e-5)


@pytest.mark.parametrize("name", ["k2-t2", "k3-t2"])
def test_moe_and_mla_helpers_find_every_layer(name):
    cfg = get_preset(name)
    model = build_model(cfg)
    assert len(list(moe_modules(model))) == cfg.num_layers - cfg.num_dense_layers
    num_mla = accounting.layer_layout(cfg).count("M")
    assert len(list(mla_modules(model))) == num_mla
    assert sum(p.numel() for p in model.parameters()) == accounting.num_params_total(cfg)


def test_same_seed_same_loss_bitwise():
    window = torch.randint(0, 64, (2, 9))
    losses = []
    for _ in range(2):
        torch.manual_seed(4)
        model = build_model(small_k3())
        losses.append(model(window[:, :-1], targets=window[:, 1:]).loss.item())
    assert losses[0] == losses[1]


def test_build_model_rejects_other_types():
    with pytest.raises(TypeError, match="build_model"):
        build_model(object())  # type: ignore[arg-type]


@pytest.mark.parametrize("activation", ["swiglu", "situ"])
def test_glu_feed_forward_matches_its_formula(activation):
    torch.manual_seed(5)
    ffn = GLUFeedForward(12, 20, activation, 4.0, 25.0, init_std=0.5)
    x = torch.randn(3, 7, 12)
    # fp64 reference (the SiTU op computes in fp32, so the module runs in fp32).
    x64 = x.double()
    g, u = x64 @ ffn.w_gate.weight.double().T, x64 @ ffn.w_up.weight.double().T
    if activation == "swiglu":
        hidden = g * torch.sigmoid(g) * u
    else:
        # SiTU-GLU, architecture.md section 6.
        hidden = 4.0 * torch.tanh(g / 4.0) * torch.sigmoid(g) * 25.0 * torch.tanh(u / 25.0)
    expected = hidden @ ffn.w_down.weight.double().T
    assert rel_rms(ffn(x).double(), expected) < 1e-6
    with pytest.raises(ValueError, match="activation"):
        GLUFeedForward(4, 4, "relu", 4.0, 25.0, 0.02)  # type: ignore[arg-type]
