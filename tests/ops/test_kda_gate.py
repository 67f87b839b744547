"""KDA decay gates: formulas against an fp64 from-scratch evaluation, ranges at extreme inputs."""

from __future__ import annotations

import math

import pytest
import torch

from k3scale.ops.kda import kda_gate_bounded, kda_gate_softplus

HEADS, D_KEY = 3, 4


def gate_params(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    A_log = torch.randn(HEADS, generator=gen)
    dt_bias = torch.randn(HEADS * D_KEY, generator=gen) - 3
    return A_log, dt_bias


def reference_logits(z, A_log, dt_bias) -> torch.Tensor:
    """exp(A_h) * (z + b) in fp64, with head h owning dt_bias[h*K:(h+1)*K]."""
    rate = A_log.double().exp().view(HEADS, 1)
    return rate * (z.double() + dt_bias.double().view(HEADS, D_KEY))


def test_bounded_gate_formula():
    A_log, dt_bias = gate_params(0)
    z = 3 * torch.randn(2, 5, HEADS, D_KEY)
    expected = -5.0 / (1 + torch.exp(-reference_logits(z, A_log, dt_bias)))
    g = kda_gate_bounded(z, A_log, dt_bias)
    assert g.dtype == torch.float32
    torch.testing.assert_close(g.double(), expected, rtol=1e-6, atol=1e-7)


def test_softplus_gate_formula():
    A_log, dt_bias = gate_params(1)
    z = 3 * torch.randn(2, 5, HEADS, D_KEY)
    rate = A_log.double().exp().view(HEADS, 1)
    expected = -rate * torch.log1p(torch.exp(z.double() + dt_bias.double().view(HEADS, D_KEY)))
    g = kda_gate_softplus(z, A_log, dt_bias)
    torch.testing.assert_close(g.double(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("lower_bound", [-5.0, -2.0])
def test_bounded_gate_range(lower_bound):
    """Open interval (lower_bound, 0) for moderate inputs; closed and finite up to +-1e4.

    fp32 sigmoid saturates to exactly 0 or 1 beyond |x| ~ 17 (upper) / ~ 104 (lower), so the
    open bounds can only hold before saturation; exp(g) >= exp(lower_bound) holds everywhere.
    """
    A_log, dt_bias = gate_params(2)
    moderate = torch.linspace(-8, 8, 101).view(-1, 1, 1).expand(-1, HEADS, D_KEY)
    g = kda_gate_bounded(
        moderate - dt_bias.view(HEADS, D_KEY), torch.zeros(HEADS), dt_bias, lower_bound
    )
    assert (g > lower_bound).all() and (g < 0).all()
    extreme = torch.tensor([-1e4, -1e3, -100.0, 100.0, 1e3, 1e4]).view(-1, 1, 1)
    g = kda_gate_bounded(extreme.expand(-1, HEADS, D_KEY), A_log, dt_bias, lower_bound)
    assert torch.isfinite(g).all()
    assert (g >= lower_bound).all() and (g <= 0).all()
    assert (g.exp() >= torch.tensor(lower_bound).exp()).all()
    assert g[0].max() == 0 and g[-1].min() == lower_bound  # the saturated ends


def test_softplus_gate_is_negative():
    A_log, dt_bias = gate_params(3)
    moderate = 10 * torch.rand(64, HEADS, D_KEY) - 5
    assert (kda_gate_softplus(moderate, A_log, dt_bias) < 0).all()
    extreme = torch.tensor([-1e4, 1e4]).view(-1, 1, 1).expand(-1, HEADS, D_KEY)
    g = kda_gate_softplus(extreme, A_log, dt_bias)
    assert torch.isfinite(g).all() and (g <= 0).all()
    assert g[1].min() < -1e3 * math.exp(A_log.min().item())  # unbounded below


def test_gates_return_fp32_for_bf16_logits():
    A_log, dt_bias = gate_params(4)
    z = torch.randn(2, HEADS, D_KEY, dtype=torch.bfloat16)
    assert kda_gate_bounded(z, A_log, dt_bias).dtype == torch.float32
    assert kda_gate_softplus(z, A_log, dt_bias).dtype == torch.float32


@pytest.mark.parametrize("gate", [kda_gate_bounded, kda_gate_softplus])
def test_gate_shape_errors_name_the_parameter(gate):
    A_log, dt_bias = gate_params(5)
    z = torch.randn(2, HEADS, D_KEY)
    with pytest.raises(ValueError, match="dt_bias"):
        gate(z, A_log, dt_bias[:-1])
    with pytest.raises(ValueError, match="A_log"):
        gate(z, A_log[:-1], dt_bias)
