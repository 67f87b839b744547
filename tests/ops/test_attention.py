"""The fused causal attention kernel (ops/attention/causal.py) against torch's
scaled_dot_product_attention: output and the gradients of q, k and v."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from k3scale.ops.attention.causal import causal_attention, fused_supported
from tests.conftest import require_fused_kernels

# fp64: reassociation only. fp32: the kernel's exp is ATen's 20-ulp one; observed ~1e-6.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return require_fused_kernels()


def reference(q, k, v, scale):
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale
    )
    return out.transpose(1, 2)


def fused_output(q, k, v, scale):
    return causal_attention(q, k, v, scale)[0]


def outputs_and_grads(fn, q, k, v, probe):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves, 0.37)
    (out * probe).sum().backward()
    return [out.detach(), *(x.grad for x in leaves)]


@pytest.mark.parametrize(("steps", "dk", "dv"), [(1, 4, 4), (7, 12, 8), (40, 16, 16), (70, 5, 3)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_torch_sdpa(steps, dk, dv, dtype):
    gen = torch.Generator().manual_seed(steps * 31 + dk)
    q = 2 * torch.randn(2, steps, 3, dk, generator=gen, dtype=dtype)
    k = 2 * torch.randn(2, steps, 3, dk, generator=gen, dtype=dtype)
    v = torch.randn(2, steps, 3, dv, generator=gen, dtype=dtype)
    probe = torch.randn(2, steps, 3, dv, generator=gen, dtype=dtype)
    expected = outputs_and_grads(reference, q, k, v, probe)
    actual = outputs_and_grads(fused_output, q, k, v, probe)
    for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
        # Floor 0.1 (inputs and gradients are O(1)): at T = 1, dq is exactly zero in exact
        # arithmetic and rounding noise (~1e-7) in both paths.
        error = ((a - e).abs().max() / e.abs().max().clamp(min=0.1)).item()
        assert error < TOLERANCE[dtype], (index, error)


@pytest.mark.parametrize(("steps", "dk"), [(1, 4), (37, 12), (70, 5)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_head_max_is_the_largest_causal_logit(steps, dk, dtype):
    # QK-Clip reads it in place of recomputing the logits (models/mla.py::_max_logits).
    gen = torch.Generator().manual_seed(steps + dk)
    q, k = (2 * torch.randn(2, steps, 3, dk, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(2, steps, 3, 4, generator=gen, dtype=dtype)
    _, head_max = causal_attention(q, k, v, 0.37)
    logits = 0.37 * torch.einsum("bihd,bjhd->bhij", q, k)
    future = torch.ones(steps, steps, dtype=torch.bool).triu(1)
    expected = logits.masked_fill(future, -torch.inf).amax(dim=(2, 3))
    assert head_max.shape == (2, 3) and not head_max.requires_grad
    torch.testing.assert_close(head_max, expected, rtol=TOLERANCE[dtype], atol=0.0)


def test_supported_only_for_narrow_heads_without_autocast():
    narrow, wide = torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 24)
    assert fused_supported(narrow, narrow) and not fused_supported(wide, narrow)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_supported(narrow, narrow)
