"""SiTU-GLU (architecture.md section 6): bounds, agreement with SwiGLU, derivative, minimum."""

from __future__ import annotations

import pytest
import torch

from k3scale.ops.situ import situ, situ_glu, swiglu


def situ_glu_fp64(gate, up, beta=4.0, linear_beta=25.0):
    g, u = gate.double(), up.double()
    return (
        beta * torch.tanh(g / beta) * torch.sigmoid(g) * linear_beta * torch.tanh(u / linear_beta)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bounded_for_huge_inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    gate = ((torch.rand(4096, generator=gen) * 2 - 1) * 1e4).to(dtype)
    up = ((torch.rand(4096, generator=gen) * 2 - 1) * 1e4).to(dtype)
    extremes = torch.tensor([1e4, -1e4, 0.0, 3e4], dtype=dtype)
    gate, up = torch.cat([gate, extremes]), torch.cat([up, extremes.flip(0)])
    h = situ_glu(gate, up)
    assert h.dtype == dtype
    assert torch.isfinite(h).all()
    # |h| < beta * linear_beta = 100; bf16 rounding of values near 100 stays at or below 100.
    assert h.float().abs().max() <= 100.0
    assert h.float().abs().max() > 50.0  # the bound is approached, so the check is meaningful
    # SwiGLU on the same inputs is unbounded: the cap is what keeps h small.
    assert swiglu(gate.float(), up.float()).abs().max() > 1e6


def test_agrees_with_swiglu_near_zero():
    gen = torch.Generator().manual_seed(1)
    gate = (torch.rand(10_000, generator=gen, dtype=torch.float64) * 2 - 1) * 0.1
    up = (torch.rand(10_000, generator=gen, dtype=torch.float64) * 2 - 1) * 0.1
    relative = (situ_glu(gate, up) - swiglu(gate, up)).abs() / swiglu(gate, up).abs()
    # Taylor: relative gap g^2/(3*16) + u^2/(3*625) <= 2.2e-4 for |g|, |u| <= 0.1.
    assert relative.max() < 1e-3
    assert relative.max() > 1e-5  # but SiTU is not SwiGLU


def test_converges_to_swiglu_for_huge_caps():
    gen = torch.Generator().manual_seed(2)
    gate = torch.randn(10_000, generator=gen, dtype=torch.float64) * 5
    up = torch.randn(10_000, generator=gen, dtype=torch.float64) * 5
    capped = situ_glu(gate, up, beta=1e6, linear_beta=1e6)
    reference = swiglu(gate, up)
    # Taylor gap g^2 / (3 beta^2) < 1e-10 here; what is left is situ_glu's fp32 internal math.
    assert ((capped - reference).abs() / reference.abs().clamp_min(1e-12)).max() < 1e-5
    default = situ_glu(gate, up)
    assert ((default - reference).abs() / reference.abs().clamp_min(1e-12)).max() > 0.1


def test_derivative_at_zero_is_half():
    g = torch.zeros((), dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(situ(g, 4.0), g)
    assert abs(float(grad) - 0.5) < 1e-12


def test_minimum_at_beta_4():
    g = torch.linspace(-3.0, 0.0, 300_001, dtype=torch.float64)
    values = situ(g, 4.0)
    # architecture.md section 6 [VER]: minimum -0.26977 near g = -1.2188.
    assert abs(float(values.min()) - (-0.26977)) < 1e-5
    assert abs(float(g[values.argmin()]) - (-1.2188)) < 1e-3


def test_bf16_input_computed_in_fp32():
    gen = torch.Generator().manual_seed(3)
    gate = (torch.randn(4096, generator=gen) * 6).to(torch.bfloat16)
    up = (torch.randn(4096, generator=gen) * 40).to(torch.bfloat16)
    h = situ_glu(gate, up)
    reference = situ_glu_fp64(gate, up)
    error = (h.double() - reference).abs() / reference.abs().clamp_min(1e-3)
    assert error.max() < 1e-2


def test_uncapped_up_branch():
    gate, up = torch.tensor([2.0]), torch.tensor([1e4])
    assert float(situ_glu(gate, up, linear_beta=None)) > 1e4
