"""MLA (architecture.md 2.3) and its QK-Clip hooks (8.2) against hand-built references in fp64."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from k3scale.models.config import MLAConfig
from k3scale.models.mla import MultiHeadLatentAttention, attention_logits
from k3scale.models.rope import apply_rope, rope_cos_sin

D_MODEL = 24
RMS_EPS = 1e-5
# fp64 everywhere except RMSNorm, which computes in fp32 by contract (architecture.md 0.3) and is
# mirrored op for op below; what is left is fp64 reassociation error.
FP64_TOL = 1e-12

K2 = MLAConfig(num_heads=3, q_lora_rank=16, kv_lora_rank=12, d_nope=8, d_rope=4, d_v=6)
K3 = dataclasses.replace(K2, rope=False, output_gate=True)
VARIANTS = {
    "k2_qlora": K2,
    "k2_direct_q": dataclasses.replace(K2, q_lora_rank=None),
    "k3_qlora": K3,
    "k3_direct_q": dataclasses.replace(K3, q_lora_rank=None),
    "k3_no_tail": dataclasses.replace(K3, d_rope=0),
}


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """RMS of the difference over RMS of the reference."""
    return (
        ((actual - expected).pow(2).mean() / expected.pow(2).mean().clamp_min(1e-300)).sqrt().item()
    )


def make_mla(cfg: MLAConfig, seed: int = 0) -> MultiHeadLatentAttention:
    torch.manual_seed(seed)
    module = MultiHeadLatentAttention(D_MODEL, cfg, rms_eps=RMS_EPS, init_std=0.3).double()
    with torch.no_grad():  # non-trivial norm weights, so a skipped norm weight would show
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return module


def random_input(seq_len: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq_len, D_MODEL, generator=gen, dtype=torch.float64)


def rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`w * x / sqrt(mean(x^2) + eps)` in at least fp32 (fp64 inputs stay fp64), cast back."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    return (normed * weight.to(wide.dtype)).to(x.dtype)


def rotate_complex(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Adjacent-pair RoPE as complex multiplication: `(x_2m + i x_2m+1) * exp(i p omega_m)`."""
    d_rope = x.shape[-1]
    omega = theta ** (-torch.arange(0, d_rope, 2, dtype=torch.float64) / d_rope)
    angles = positions.double()[:, None] * omega
    phase = torch.polar(torch.ones_like(angles), angles)
    as_complex = torch.view_as_complex(x.contiguous().unflatten(-1, (-1, 2)))
    return torch.view_as_real(as_complex * phase[:, None, :]).flatten(-2)


def reference_mla(module: MultiHeadLatentAttention, x: torch.Tensor) -> torch.Tensor:
    """Plain multi-head attention from the weights: per-head q/k/v, manual causal softmax."""
    cfg = module.cfg
    heads, dn, dr, dv = cfg.num_heads, cfg.d_nope, cfg.d_rope, cfg.d_v
    batch, seq_len, _ = x.shape
    if cfg.q_lora_rank is None:
        q = x @ module.q_proj.weight.T
    else:
        c_q = rms_norm_fp32(x @ module.q_a_proj.weight.T, module.q_a_norm.weight)
        q = c_q @ module.q_b_proj.weight.T
    q = q.view(batch, seq_len, heads, dn + dr)
    kv_a = x @ module.kv_a_proj.weight.T
    c_kv, k_tail = kv_a[..., : cfg.kv_lora_rank], kv_a[..., cfg.kv_lora_rank :]
    kv = rms_norm_fp32(c_kv, module.kv_a_norm.weight) @ module.kv_b_proj.weight.T
    kv = kv.view(batch, seq_len, heads, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    q_nope, q_tail = q[..., :dn], q[..., dn:]
    k_tail = k_tail[:, :, None, :]
    if cfg.rope and dr > 0:
        positions = torch.arange(seq_len)
        q_tail = rotate_complex(q_tail, positions, cfg.rope_theta)
        k_tail = rotate_complex(k_tail, positions, cfg.rope_theta)
    logits = torch.einsum("bihd,bjhd->bhij", q_nope, k_nope)
    logits = logits + torch.einsum("bihd,bjhd->bhij", q_tail, k_tail.expand(-1, -1, heads, -1))
    logits = logits / math.sqrt(dn + dr)
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    probs = logits.masked_fill(future, -torch.inf).softmax(dim=-1)
    o = torch.einsum("bhij,bjhd->bihd", probs, v).reshape(batch, seq_len, heads * dv)
    if cfg.output_gate:
        o = torch.sigmoid(x @ module.g_proj.weight.T) * o
    return o @ module.o_proj.weight.T


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("seq_len", [1, 13])
def test_mla_matches_plain_multihead_attention(name: str, seq_len: int) -> None:
    module = make_mla(VARIANTS[name])
    x = random_input(seq_len).requires_grad_()
    cotangent = torch.randn(2, seq_len, D_MODEL, dtype=torch.float64)
    actual = module(x)
    (actual * cotangent).sum().backward()
    actual_grads = {"x": x.grad, **{n: p.grad for n, p in module.named_parameters()}}
    x.grad = None
    module.zero_grad(set_to_none=True)
    expected = reference_mla(module, x)
    (expected * cotangent).sum().backward()
    expected_grads = {"x": x.grad, **{n: p.grad for n, p in module.named_parameters()}}
    assert rel_rms(actual, expected) < FP64_TOL
    for key, grad in expected_grads.items():
        assert rel_rms(actual_grads[key], grad) < FP64_TOL, key


def test_children_and_per_head_layout() -> None:
    direct = make_mla(VARIANTS["k3_direct_q"])
    lora = make_mla(K2)
    assert direct.per_head_projections == {"q_proj": 3, "kv_b_proj": 3}
    assert lora.per_head_projections == {"q_b_proj": 3, "kv_b_proj": 3}
    assert direct.q_proj.weight.shape == (3 * (8 + 4), D_MODEL)
    assert lora.kv_a_proj.weight.shape == (12 + 4, D_MODEL)
    assert lora.kv_b_proj.weight.shape == (3 * (8 + 6), 12)
    assert direct.g_proj.weight.shape == (3 * 6, D_MODEL) and lora.g_proj is None
    assert not hasattr(direct, "q_b_proj") and not hasattr(lora, "q_proj")


def test_init_is_normal_with_init_std() -> None:
    torch.manual_seed(0)
    big = MLAConfig(num_heads=4, q_lora_rank=64, kv_lora_rank=64, d_nope=32, d_rope=16, d_v=32)
    module = MultiHeadLatentAttention(256, big, rms_eps=RMS_EPS, init_std=0.02)
    weight = module.q_a_proj.weight
    assert abs(weight.std().item() - 0.02) < 1e-3 and abs(weight.mean().item()) < 1e-3
    assert torch.equal(module.kv_a_norm.weight, torch.ones(64))


def test_rope_rotates_adjacent_pairs() -> None:
    theta, position = 10_000.0, 3
    cos, sin = rope_cos_sin(torch.tensor([position]), 4, theta, torch.float64)
    first_pair = apply_rope(torch.tensor([[[[1.0, 0.0, 0.0, 0.0]]]], dtype=torch.float64), cos, sin)
    second_pair = apply_rope(
        torch.tensor([[[[0.0, 0.0, 0.0, 1.0]]]], dtype=torch.float64), cos, sin
    )
    angle_0, angle_1 = position * 1.0, position * theta**-0.5
    expected_first = [math.cos(angle_0), math.sin(angle_0), 0.0, 0.0]
    expected_second = [0.0, 0.0, -math.sin(angle_1), math.cos(angle_1)]
    torch.testing.assert_close(first_pair.flatten().tolist(), expected_first, rtol=0, atol=1e-15)
    torch.testing.assert_close(second_pair.flatten().tolist(), expected_second, rtol=0, atol=1e-15)


def test_k2_logits_depend_only_on_relative_position() -> None:
    module, x = make_mla(K2), random_input(11)
    base = attention_logits(module, x)
    shifted = attention_logits(module, x, positions=torch.arange(11) + 1234)
    stretched = attention_logits(module, x, positions=2 * torch.arange(11))
    valid = torch.isfinite(base)
    assert rel_rms(shifted[valid], base[valid]) < 1e-12
    assert rel_rms(stretched[valid], base[valid]) > 1e-3  # RoPE is really on


def permuted_pair_logits(cfg: MLAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the same token pairs before and after shuffling the tokens' positions."""
    module, x = make_mla(cfg), random_input(12)
    permutation = torch.randperm(12, generator=torch.Generator().manual_seed(5))
    before = attention_logits(module, x)
    after = attention_logits(module, x[:, permutation])
    # after[a, b] pairs tokens permutation[a], permutation[b]; compare pairs causal in both.
    before_same_pairs = before[:, :, permutation][:, :, :, permutation]
    both_valid = torch.isfinite(after) & torch.isfinite(before_same_pairs)
    assert both_valid.sum() > 50
    return after[both_valid], before_same_pairs[both_valid]


def test_k3_logits_do_not_depend_on_position() -> None:
    after, before = permuted_pair_logits(K3)
    assert rel_rms(after, before) < 1e-14
    after_k2, before_k2 = permuted_pair_logits(K2)
    assert rel_rms(after_k2, before_k2) > 1e-3  # the same check catches position dependence


def test_zero_gate_halves_the_ungated_output() -> None:
    gated = make_mla(K3)
    ungated = MultiHeadLatentAttention(
        D_MODEL, dataclasses.replace(K3, output_gate=False), RMS_EPS, 0.3
    ).double()
    state = {k: v for k, v in gated.state_dict().items() if not k.startswith("g_proj")}
    ungated.load_state_dict(state)
    x = random_input(9)
    assert not torch.equal(gated(x), 0.5 * ungated(x))
    with torch.no_grad():
        gated.g_proj.weight.zero_()
    assert torch.equal(gated(x), 0.5 * ungated(x))


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("name", ["k2_qlora", "k3_direct_q"])
def test_max_logits_track_the_running_max_over_valid_pairs(name: str, fused: bool) -> None:
    # Fused: the attention kernel's own per-head max (ops/attention), same fp64 values up to
    # the order of each dot product's sum.
    module = make_mla(VARIANTS[name])
    module.fused_attention = fused
    x_1, x_2 = random_input(13, seed=2), 3.0 * random_input(13, seed=3)
    module(x_1)
    assert torch.isinf(module.max_logits).all()  # off by default
    module.track_max_logits = True
    # 3 query rows per chunk (13 = 4 * 3 + 1): exercises chunk edges and the causal cut.
    module.max_logit_chunk_elements = 3 * 2 * 3 * 13
    module(x_1)
    expected_1 = attention_logits(module, x_1).amax(dim=(0, 2, 3))
    torch.testing.assert_close(module.max_logits, expected_1, rtol=1e-13, atol=0)
    module(x_2)
    expected_2 = torch.maximum(expected_1, attention_logits(module, x_2).amax(dim=(0, 2, 3)))
    torch.testing.assert_close(module.max_logits, expected_2, rtol=1e-13, atol=0)
    assert not module.max_logits.requires_grad
    module.reset_max_logits()
    assert torch.isinf(module.max_logits).all() and (module.max_logits < 0).all()


def test_eval_forwards_fold_no_max_logits() -> None:
    """Validation windows must not feed the next step's QK-Clip (issue 23)."""
    module = make_mla(VARIANTS["k2_qlora"])
    module.track_max_logits = True
    x_train, x_val = random_input(9, seed=4), 5.0 * random_input(9, seed=5)
    module(x_train)
    after_train = module.max_logits.clone()
    module.eval()
    module(x_val)
    assert torch.equal(module.max_logits, after_train)
    module.train()
    module(x_val)
    assert (module.max_logits > after_train).any()


@pytest.mark.parametrize("name", ["k2_qlora", "k2_direct_q", "k3_qlora"])
def test_rescale_qk_heads_scales_one_heads_logits(name: str) -> None:
    module, x = make_mla(VARIANTS[name]), random_input(10)
    before_logits = attention_logits(module, x)
    _, _, before_v = module.project_qkv(x)
    before_params = {n: p.detach().clone() for n, p in module.named_parameters()}
    gamma = torch.tensor([1.0, 0.3, 1.0], dtype=torch.float64)
    module.rescale_qk_heads(gamma)
    after_logits = attention_logits(module, x)
    _, _, after_v = module.project_qkv(x)

    valid = torch.isfinite(before_logits[:, 1])
    assert rel_rms(after_logits[:, 1][valid], 0.3 * before_logits[:, 1][valid]) < 1e-14
    assert torch.equal(after_logits[:, [0, 2]], before_logits[:, [0, 2]])
    assert torch.equal(after_v, before_v)
    after_params = dict(module.named_parameters())
    q_name = next(n for n in module.per_head_projections if n.startswith("q"))
    for param_name, before in before_params.items():
        if param_name not in (f"{q_name}.weight", "kv_b_proj.weight"):
            assert torch.equal(after_params[param_name], before), param_name
    q_rows = after_params[f"{q_name}.weight"].view(3, 12, -1)
    assert torch.equal(q_rows[[0, 2]], before_params[f"{q_name}.weight"].view(3, 12, -1)[[0, 2]])
    kv_rows = after_params["kv_b_proj.weight"].view(3, 14, -1)
    before_kv_rows = before_params["kv_b_proj.weight"].view(3, 14, -1)
    assert torch.equal(kv_rows[:, 8:], before_kv_rows[:, 8:])  # every v row
    assert torch.equal(kv_rows[[0, 2]], before_kv_rows[[0, 2]])


def test_rescale_qk_heads_rejects_bad_gamma() -> None:
    module = make_mla(K2)
    with pytest.raises(ValueError, match="gamma"):
        module.rescale_qk_heads(torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="gamma"):
        module.rescale_qk_heads(torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64))


@pytest.mark.parametrize("name", ["k2_qlora", "k3_qlora"])
def test_mla_is_causal(name: str) -> None:
    module, x = make_mla(VARIANTS[name]), random_input(15)
    cut = 7
    perturbed = x.clone()
    perturbed[:, cut + 1 :] += torch.randn_like(perturbed[:, cut + 1 :])
    out, out_perturbed = module(x), module(perturbed)
    assert torch.allclose(out[:, : cut + 1], out_perturbed[:, : cut + 1], rtol=0, atol=1e-14)
    assert not torch.allclose(out[:, cut + 1 :], out_perturbed[:, cut + 1 :], atol=1e-6)


def test_bf16_forward_runs_and_is_close_to_fp32() -> None:
    torch.manual_seed(0)
    module = MultiHeadLatentAttention(D_MODEL, K2, rms_eps=RMS_EPS, init_std=0.3)
    x = random_input(17).float()
    expected = module(x)
    actual = module.to(torch.bfloat16)(x.bfloat16())
    assert actual.dtype == torch.bfloat16
    # bf16 has an 8-bit mantissa (unit roundoff 2^-8 = 0.4%); a few roundings compound.
    assert rel_rms(actual.float(), expected) < 3e-2


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_padded_heads_give_the_same_output_and_gradients(name: str, dtype: torch.dtype) -> None:
    # The "cpu" backend pads q, k and v to one width for torch's flash SDPA kernel; the math
    # path of the unpadded module is the reference. fp32 differs by summation order only.
    reference = make_mla(VARIANTS[name]).to(dtype)
    padded = make_mla(VARIANTS[name]).to(dtype)
    padded.padded_width = 16  # the flash path, without the fused kernel
    x = random_input(40).to(dtype)
    results = []
    for module in (reference, padded):
        inputs = x.clone().requires_grad_()
        out = module(inputs)
        out.square().sum().backward()
        results.append([out.detach(), inputs.grad] + [p.grad for p in module.parameters()])
    tolerance = FP64_TOL if dtype == torch.float64 else 1e-5
    for actual, expected in zip(results[1], results[0], strict=True):
        assert rel_rms(actual, expected) < tolerance


def test_fast_attention_pads_the_widest_head_up_to_a_vector() -> None:
    module = MultiHeadLatentAttention(D_MODEL, K2, RMS_EPS, 0.02, fast_attention=True)
    assert module.padded_width == 16  # d_nope + d_rope = 12 -> 16
    assert MultiHeadLatentAttention(D_MODEL, K2, RMS_EPS, 0.02).padded_width is None


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fused_attention_gives_the_same_output_and_gradients(name: str) -> None:
    reference = make_mla(VARIANTS[name])
    fused = make_mla(VARIANTS[name])
    fused.fused_attention = True
    x = random_input(40)
    results = []
    for module in (reference, fused):
        inputs = x.clone().requires_grad_()
        out = module(inputs)
        out.square().sum().backward()
        results.append([out.detach(), inputs.grad] + [p.grad for p in module.parameters()])
    for actual, expected in zip(results[1], results[0], strict=True):
        assert rel_rms(actual, expected) < FP64_TOL
