"""KimiDeltaAttention layer: contract names and shapes, parameter count, inits, causality,
streaming, gradients, and parity with fla's layer when it is installed."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from k3scale.models.config import KDAConfig
from k3scale.models.kda import KimiDeltaAttention

D_MODEL = 48


def make_layer(dtype=torch.float64, seed=0, **overrides) -> KimiDeltaAttention:
    torch.manual_seed(seed)
    cfg = KDAConfig(**({"num_heads": 3, "d_head": 8, "chunk_size": 16} | overrides))
    # init_std 0.2 (not 0.02) so the tiny layer's output is far from zero in every test.
    return KimiDeltaAttention(D_MODEL, cfg, rms_eps=1e-5, init_std=0.2).to(dtype)


def kda_param_count(d: int, num_heads: int, h: int, conv: int, full_gate: bool) -> int:
    """architecture.md 1.2: N_KDA = 3dP + K_c*3P + (d*h + h*P) + d*H + H + P + N_gate + h + P*d."""
    P = num_heads * h
    gate = d * P if full_gate else d * h + h * P
    return (
        3 * d * P
        + conv * 3 * P
        + (d * h + h * P)
        + d * num_heads
        + num_heads
        + P
        + gate
        + h
        + P * d
    )


def test_child_names_and_shapes_full_gate():
    layer = make_layer()
    P, H, dh = 24, 3, 8
    expected = {
        "q_proj.weight": (P, D_MODEL),
        "k_proj.weight": (P, D_MODEL),
        "v_proj.weight": (P, D_MODEL),
        "q_conv.weight": (P, 1, 4),
        "k_conv.weight": (P, 1, 4),
        "v_conv.weight": (P, 1, 4),
        "f_proj_down.weight": (dh, D_MODEL),
        "f_proj_up.weight": (P, dh),
        "dt_bias": (P,),
        "A_log": (H,),
        "b_proj.weight": (H, D_MODEL),
        "g_proj.weight": (P, D_MODEL),
        "o_norm.weight": (dh,),
        "o_proj.weight": (D_MODEL, P),
    }
    assert {n: tuple(p.shape) for n, p in layer.named_parameters()} == expected
    assert layer.per_head_projections == {"q_proj": H, "k_proj": H, "v_proj": H}


def test_low_rank_gate_children_and_optional_bias():
    names = dict(make_layer(output_gate="low_rank").named_parameters())
    assert tuple(names["g_proj_down.weight"].shape) == (8, D_MODEL)
    assert tuple(names["g_proj_up.weight"].shape) == (24, 8)
    assert "g_proj_up.bias" not in names and "g_proj.weight" not in names
    with_bias = dict(make_layer(output_gate="low_rank", output_gate_bias=True).named_parameters())
    assert tuple(with_bias["g_proj_up.bias"].shape) == (24,)


@pytest.mark.parametrize("output_gate", ["full", "low_rank"])
def test_parameter_count_matches_formula(output_gate):
    layer = make_layer(output_gate=output_gate)
    actual = sum(p.numel() for p in layer.parameters())
    assert actual == kda_param_count(D_MODEL, 3, 8, 4, full_gate=output_gate == "full")


@pytest.mark.parametrize(
    ("d_model", "num_heads", "output_gate", "published"),
    [(7168, 96, "full", 443_740_384), (2304, 32, "low_rank", 39_514_272)],
    ids=["kimi-k3", "kimi-linear-48b"],
)
def test_full_scale_parameter_count(d_model, num_heads, output_gate, published):
    """Built on the meta device (no memory); counts from architecture.md 1.2."""
    cfg = KDAConfig(num_heads=num_heads, d_head=128, output_gate=output_gate)
    with torch.device("meta"):
        layer = KimiDeltaAttention(d_model, cfg, rms_eps=1e-5, init_std=0.02)
    assert sum(p.numel() for p in layer.parameters()) == published


def test_inits():
    bounded = make_layer(dtype=torch.float32, num_heads=64)
    assert torch.equal(bounded.A_log, torch.zeros(64))
    dt = F.softplus(bounded.dt_bias)
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
    assert dt.max() > 0.05 and dt.min() < 0.002  # spread log-uniformly over the range
    softplus = make_layer(dtype=torch.float32, num_heads=64, gate="softplus")
    assert softplus.A_log.min() >= 0 and softplus.A_log.max() <= math.log(16)
    assert softplus.A_log.std() > 0.3
    assert softplus.dt_bias.dtype == softplus.A_log.dtype == torch.float32


@pytest.mark.parametrize("gate", ["bounded", "softplus"])
def test_causal(gate):
    layer = make_layer(gate=gate)
    x = torch.randn(2, 40, D_MODEL, dtype=torch.float64)
    y = layer(x)
    for t in (0, 17, 38):
        perturbed = x.clone()
        perturbed[:, t + 1 :] += torch.randn_like(perturbed[:, t + 1 :])
        y_perturbed = layer(perturbed)
        torch.testing.assert_close(y_perturbed[:, : t + 1], y[:, : t + 1], rtol=1e-12, atol=1e-14)
        assert not torch.allclose(y_perturbed[:, t + 1 :], y[:, t + 1 :])


@pytest.mark.parametrize("splits", [[20, 20], [1, 2, 37], [39, 1]])
def test_streaming_calls_equal_one_call(splits):
    layer = make_layer(output_gate="low_rank", gate="softplus")
    x = torch.randn(2, 40, D_MODEL, dtype=torch.float64)
    y_full = layer(x)
    state, pieces, start = None, [], 0
    for length in splits:
        y, state = layer(x[:, start : start + length], state=state, return_state=True)
        pieces.append(y)
        start += length
    torch.testing.assert_close(torch.cat(pieces, dim=1), y_full, rtol=1e-10, atol=1e-12)
    assert state.recurrent.shape == (2, 3, 8, 8)
    assert all(tail.shape == (2, 24, 3) for tail in state.conv_tails)


def test_token_by_token_equals_one_call():
    layer = make_layer()
    x = torch.randn(1, 12, D_MODEL, dtype=torch.float64)
    y_full, final = layer(x, return_state=True)
    state, pieces = None, []
    for t in range(12):
        y, state = layer(x[:, t : t + 1], state=state, return_state=True)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, dim=1), y_full, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(state.recurrent, final.recurrent, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("gate", "output_gate"), [("bounded", "full"), ("softplus", "low_rank")])
def test_every_parameter_gets_a_finite_gradient(gate, output_gate):
    layer = make_layer(dtype=torch.float32, gate=gate, output_gate=output_gate)
    x = torch.randn(2, 33, D_MODEL)
    layer(x).pow(2).sum().backward()
    for name, param in layer.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().max() > 0, name


def test_bf16_forward_runs_and_returns_bf16():
    layer = make_layer(dtype=torch.bfloat16)
    y = layer(torch.randn(1, 20, D_MODEL, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()


# fla's name (architecture.md 1.4) -> ours, for the Kimi Linear variant (low-rank gate + bias).
FLA_TO_OURS = {
    "q_proj.weight": "q_proj.weight",
    "k_proj.weight": "k_proj.weight",
    "v_proj.weight": "v_proj.weight",
    "q_conv1d.weight": "q_conv.weight",
    "k_conv1d.weight": "k_conv.weight",
    "v_conv1d.weight": "v_conv.weight",
    "f_proj.0.weight": "f_proj_down.weight",
    "f_proj.1.weight": "f_proj_up.weight",
    "b_proj.weight": "b_proj.weight",
    "A_log": "A_log",
    "dt_bias": "dt_bias",
    "g_proj.0.weight": "g_proj_down.weight",
    "g_proj.1.weight": "g_proj_up.weight",
    "g_proj.1.bias": "g_proj_up.bias",
    "o_norm.weight": "o_norm.weight",
    "o_proj.weight": "o_proj.weight",
}


def test_parameter_parity_with_fla_layer():
    if importlib.util.find_spec("fla") is None or importlib.util.find_spec("fla.layers") is None:
        pytest.skip(
            "fla.layers is not installed: fla-core ships ops only; the layer comes with "
            "flash-linear-attention (and its import needs triton)"
        )
    from fla.layers.kda import KimiDeltaAttention as FlaKDA

    fla = FlaKDA(hidden_size=D_MODEL, head_dim=8, num_heads=3, mode="chunk", norm_eps=1e-5)
    ours = make_layer(output_gate="low_rank", output_gate_bias=True, gate="softplus")
    fla_shapes = {n: tuple(p.shape) for n, p in fla.named_parameters()}
    our_shapes = {n: tuple(p.shape) for n, p in ours.named_parameters()}
    assert set(fla_shapes) == set(FLA_TO_OURS)
    assert {FLA_TO_OURS[n]: s for n, s in fla_shapes.items()} == our_shapes
