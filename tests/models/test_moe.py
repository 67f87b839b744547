"""MoE layer (architecture.md 5.4): router semantics, bias buffer, end-to-end reference,
Stable LatentMoE scale invariance and reduction to a standard MoE, shared experts."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from k3scale.models.config import MoEConfig
from k3scale.models.ffn import GLUFeedForward
from k3scale.models.moe import MoE, glu_activation
from k3scale.models.presets import get_preset
from k3scale.ops.moe import routed_experts_naive
from k3scale.ops.situ import swiglu
from tests.conftest import require_fused_kernels

D_MODEL = 32


def rel_rms(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt())


def make_moe(seed=0, activation="swiglu", **fields):
    base = {"num_experts": 8, "top_k": 2, "d_expert": 12, "num_shared": 1, "routed_scale": 2.827}
    torch.manual_seed(seed)
    cfg = MoEConfig(**{**base, **fields})
    # Router std 0.3 (not 0.02) so the scores are well separated in the tests.
    return MoE(D_MODEL, cfg, activation, 4.0, 25.0, 0.3, 1e-5)


def tokens(num=63, seed=1):
    return torch.randn(1, num, D_MODEL, generator=torch.Generator().manual_seed(seed))


def test_selection_uses_bias_weights_use_scores_only():
    moe = make_moe()
    x = tokens()[0]
    scores = torch.sigmoid(x @ moe.router.weight.T)
    moe.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 5.0]))
    routing = moe.route(x)
    # A large bias forces experts 3 and 7 into every selection ...
    assert torch.equal(routing.expert_idx.sort(-1).values, torch.tensor([[3, 7]]).expand(63, 2))
    # ... but the weights are the unbiased scores renormalised over the selection, times rho.
    chosen = scores[:, [3, 7]]
    expected = 2.827 * chosen / chosen.sum(-1, keepdim=True)
    got = routing.weights.gather(-1, routing.expert_idx.argsort(-1))
    assert torch.allclose(got, expected, atol=1e-6)
    assert torch.allclose(routing.weights.sum(-1), torch.full((63,), 2.827))


def test_router_logits_are_fp32_for_bf16_input():
    moe = make_moe().to(torch.bfloat16)
    assert moe.bias.dtype == torch.float32  # survives module-wide casts
    assert moe.w_gate.dtype == torch.bfloat16
    routing = moe.route(tokens()[0].to(torch.bfloat16))
    assert routing.scores.dtype == torch.float32
    assert routing.weights.dtype == torch.float32


def test_bias_is_a_persistent_buffer_without_gradient():
    moe = make_moe()
    assert "bias" in moe.state_dict()
    assert "bias" not in dict(moe.named_parameters())
    assert moe.bias.dtype == torch.float32 and not moe.bias.requires_grad
    moe.train()
    moe(tokens()).square().sum().backward()
    assert moe.bias.grad is None
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    # Step statistics are transient: not saved in checkpoints.
    assert "step_loads" not in moe.state_dict()


@pytest.mark.parametrize("latent", [None, 16])
def test_forward_matches_reference_composition(latent):
    moe = make_moe(d_latent=latent, activation="situ" if latent else "swiglu")
    x = tokens()
    flat = x[0]
    scores = torch.sigmoid(flat @ moe.router.weight.T)
    selection = torch.topk(scores + moe.bias, 2).indices
    chosen = scores.gather(-1, selection)
    weights = moe.cfg.routed_scale * chosen / chosen.sum(-1, keepdim=True)
    routed_in = flat if latent is None else flat @ moe.latent_down.weight.T
    routed = routed_experts_naive(
        routed_in, selection, weights, moe.w_gate, moe.w_up, moe.w_down, moe.activation
    )
    if latent is not None:
        routed = moe.latent_norm(routed) @ moe.latent_up.weight.T
    expected = routed + moe.shared(flat)
    assert rel_rms(moe(x)[0], expected) < 1e-5


def test_latent_norm_makes_routed_scale_inert():
    a = make_moe(d_latent=16, routed_scale=1.0, activation="situ")
    b = make_moe(d_latent=16, routed_scale=3.7, activation="situ")
    b.load_state_dict(a.state_dict())
    x = tokens()
    assert rel_rms(b(x), a(x)) < 1e-4
    a_off = make_moe(d_latent=16, routed_scale=1.0, latent_norm=False, activation="situ")
    b_off = make_moe(d_latent=16, routed_scale=3.7, latent_norm=False, activation="situ")
    b_off.load_state_dict(a_off.state_dict())
    assert rel_rms(b_off(x), a_off(x)) > 0.1


def test_identity_latent_without_norm_is_a_standard_moe():
    standard = make_moe(routed_scale=1.0)
    latent = make_moe(d_latent=D_MODEL, latent_norm=False, routed_scale=1.0)
    with torch.no_grad():
        latent.latent_down.weight.copy_(torch.eye(D_MODEL))
        latent.latent_up.weight.copy_(torch.eye(D_MODEL))
    state = {k: v for k, v in standard.state_dict().items()}
    latent.load_state_dict(state, strict=False)
    x = tokens()
    assert rel_rms(latent(x), standard(x)) < 1e-6
    with torch.no_grad():
        latent.latent_up.weight.mul_(2.0)
    assert rel_rms(latent(x), standard(x)) > 1e-2


def test_two_shared_experts_equal_one_wide_mlp():
    torch.manual_seed(3)
    first, second, wide = (GLUFeedForward(D_MODEL, f, "situ", 4.0, 25.0, 0.2) for f in (12, 12, 24))
    with torch.no_grad():
        wide.w_gate.weight.copy_(torch.cat([first.w_gate.weight, second.w_gate.weight], 0))
        wide.w_up.weight.copy_(torch.cat([first.w_up.weight, second.w_up.weight], 0))
        wide.w_down.weight.copy_(torch.cat([first.w_down.weight, second.w_down.weight], 1))
    x = tokens()
    assert rel_rms(wide(x), first(x) + second(x)) < 1e-6
    assert rel_rms(wide(x), 2 * first(x)) > 1e-2


def test_moe_config_builds_shared_width():
    moe = make_moe(num_shared=2, d_expert=12)
    assert moe.shared.w_gate.weight.shape == (24, D_MODEL)
    assert make_moe(num_shared=0).shared is None
    assert moe.w_gate.shape == (8, 12, D_MODEL) and moe.w_down.shape == (8, D_MODEL, 12)


def expected_sequence_aux(scores, selection, alpha):
    """DeepSeek-V3 eq. per sequence, written as loops over sequences and experts."""
    batch, seq_len, num_experts = scores.shape
    top_k = selection.shape[-1]
    total = 0.0
    for b in range(batch):
        normalised = scores[b] / scores[b].sum(-1, keepdim=True)
        for e in range(num_experts):
            f_e = num_experts / (top_k * seq_len) * float((selection[b] == e).any(-1).sum())
            total += f_e * float(normalised[:, e].mean())
    return alpha * total / batch


def test_sequence_aux_loss():
    moe = make_moe(seq_aux_alpha=1e-4)
    x = torch.randn(3, 21, D_MODEL, generator=torch.Generator().manual_seed(4))
    moe.train()
    moe(x)
    scores = torch.sigmoid(x @ moe.router.weight.T).detach()
    selection = torch.topk(scores, 2).indices
    assert abs(float(moe.aux_loss.detach()) - expected_sequence_aux(scores, selection, 1e-4)) < 1e-9
    assert moe.aux_loss.requires_grad
    moe.eval()
    moe(x)
    assert float(moe.aux_loss) == 0.0
    off = make_moe()
    off.train()
    off(x)
    assert float(off.aux_loss) == 0.0


def test_unknown_activation_is_rejected():
    with pytest.raises(ValueError, match="activation"):
        MoE(D_MODEL, dataclasses.replace(make_moe().cfg), "gelu", 4.0, 25.0, 0.02, 1e-5)


def test_swiglu_activation_is_plain_swiglu():
    assert glu_activation("swiglu", 4.0, 25.0) is swiglu


def torch_only(moe: MoE) -> MoE:
    """A copy of `moe` that runs the plain torch paths (no fused C++ kernels)."""
    reference = copy.deepcopy(moe)
    reference.kernel_activation = None
    if reference.shared is not None:
        reference.shared._kernel_activation = None
    return reference


@pytest.mark.parametrize("preset", ["k2-t2", "k3-t2"])
def test_fused_layer_matches_torch_layer(preset):
    # The whole layer as the studies run it (training mode, aux loss, QB or loss-free
    # statistics): the fused CPU kernels against the torch paths, outputs and every gradient.
    check_fused_layer(get_preset(preset), get_preset(preset).moe)


@pytest.mark.parametrize("balancing", ["loss_free", "quantile"])
def test_fused_k2_layer_with_two_shared_experts_matches_torch_layer(balancing):
    # K2's single fused node (router, aux loss, routed and shared experts) runs a shared GLU of
    # width S * f as S experts of width f: S = 2 checks that split and its gradients' layout.
    cfg = get_preset("k2-t1")
    moe_cfg = dataclasses.replace(cfg.moe, num_shared=2, balancing=balancing)
    fused, reference = check_fused_layer(cfg, moe_cfg)
    fused.eval()
    reference.eval()
    with torch.no_grad():
        x = torch.randn(2, 16, cfg.d_model)
        assert rel_rms(fused(x), reference(x)) < 1e-5


@pytest.mark.parametrize("term", ["out", "aux"])
@pytest.mark.parametrize("preset", ["k2-t1", "k3-t1"])
def test_fused_layer_when_one_output_reaches_the_loss(preset, term):
    # The single node's backward gets None for an output the loss does not use (no zeros are
    # materialised): only the layer's output (as in `bench moe`), or only its aux loss (on
    # here for K3 too, whose preset has it off).
    cfg = get_preset(preset)
    check_fused_layer(cfg, dataclasses.replace(cfg.moe, seq_aux_alpha=1e-4), loss_terms=(term,))


@pytest.mark.parametrize("latent_norm", [True, False])
def test_fused_k3_layer_with_and_without_latent_norm_matches_torch_layer(latent_norm):
    # K3's single node (router, aux loss, latent projections, RMSNorm, routed and shared
    # experts) with the latent norm on (its weight gets a gradient) and off; loss-free balancing
    # here, Quantile Balancing in the preset test above.
    cfg = get_preset("k3-t1")
    moe_cfg = dataclasses.replace(cfg.moe, latent_norm=latent_norm, balancing="loss_free")
    fused, reference = check_fused_layer(cfg, moe_cfg)
    if latent_norm:
        with torch.no_grad():  # a non-trivial norm weight, so its use in the backward is checked
            for layer in (fused, reference):
                layer.latent_norm.weight.copy_(torch.linspace(0.5, 1.5, moe_cfg.d_latent))
        check_pair(fused, reference, cfg.d_model, ("out", "aux"))


def check_fused_layer(cfg, moe_cfg, loss_terms=("out", "aux")) -> tuple[MoE, MoE]:
    require_fused_kernels()
    torch.manual_seed(0)
    fused = MoE(
        cfg.d_model, moe_cfg, cfg.activation, cfg.situ_beta, cfg.situ_linear_beta, 0.3, 1e-5
    )
    reference = torch_only(fused)
    assert fused.kernel_activation is not None and reference.kernel_activation is None
    assert fused._fuses_layer(torch.zeros(1, cfg.d_model))  # the single node, not the composition
    check_pair(fused, reference, cfg.d_model, loss_terms)
    return fused, reference


def check_pair(fused: MoE, reference: MoE, d_model: int, loss_terms) -> None:
    """Training forward+backward of both layers: outputs, aux loss, statistics, every grad."""
    inputs = torch.randn(4, 32, d_model, generator=torch.Generator().manual_seed(2))
    results = []
    for layer in (fused, reference):
        layer.train()
        layer.zero_grad(set_to_none=True)
        layer.reset_statistics()
        x = inputs.clone().requires_grad_()  # the input's gradient too (the residual stream's)
        out = layer(x)
        terms = {"out": out.square().mean(), "aux": layer.aux_loss}
        sum(terms[name] for name in loss_terms).backward()
        grads = {name: p.grad for name, p in layer.named_parameters()} | {"input": x.grad}
        results.append((out, layer.aux_loss, grads, layer.statistics()))
    (out, aux, grads, stats), (ref_out, ref_aux, ref_grads, ref_stats) = results
    assert rel_rms(out, ref_out) < 1e-5
    assert torch.equal(stats, ref_stats)  # same selections, so identical loads and QB counts
    if fused.cfg.seq_aux_alpha > 0:
        assert rel_rms(aux, ref_aux) < 1e-5
    for name, grad in ref_grads.items():
        if grad is None:  # not reached by the loss: the fused node may return zeros
            assert grads[name] is None or not grads[name].any(), name
        else:
            assert rel_rms(grads[name], grad) < 1e-5, name
