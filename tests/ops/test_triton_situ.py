"""Fused Triton SiTU-GLU (`k3scale/ops/situ/triton.py`) vs `naive.situ_glu` (interpreter)."""

from __future__ import annotations

import pytest
import torch

from tests.ops.triton_interpret import interpreted, launch_interpreted

# Triton reads TRITON_INTERPRET at import and when kernels are decorated (in this block) and
# at launch (the fixture below).
with interpreted() as SET_INTERPRET:
    pytest.importorskip("triton")
    from k3scale.ops.situ.naive import situ_glu
    from k3scale.ops.situ.triton import situ_glu_triton

pytestmark = pytest.mark.triton
interpret_triton = launch_interpreted(SET_INTERPRET)


# Relative RMS vs fp64: fp32 math inside (observed ~1e-7); bf16 I/O rounds to 8 mantissa bits.
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def nan_filled_empty(monkeypatch):
    """Buffers from torch.empty start as NaN, so a kernel that skips an element fails loudly."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", empty)


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected||_rms / ||expected||_rms in fp64."""
    diff = (actual.double() - expected.double()).pow(2).mean().sqrt()
    return (diff / expected.double().pow(2).mean().sqrt()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("linear_beta", [25.0, None])
def test_halves_of_one_tensor_match_reference(dtype, linear_beta):
    # Odd sizes; gate/up are strided views of one [..., 2f] tensor (the fused-weight layout).
    width = 37
    gen = torch.Generator().manual_seed(0)
    fused = (6.0 * torch.randn(3, 5, 2 * width, generator=gen)).to(dtype).requires_grad_()
    h = situ_glu_triton(fused[..., :width], fused[..., width:], 4.0, linear_beta)
    d_h = torch.randn(h.shape, generator=gen).to(dtype)
    (grad,) = torch.autograd.grad(h, fused, d_h)
    reference = fused.detach().double().requires_grad_()
    h_ref = situ_glu(reference[..., :width], reference[..., width:], 4.0, linear_beta)
    (grad_ref,) = torch.autograd.grad(h_ref, reference, d_h.double())
    assert h.dtype == grad.dtype == dtype
    assert rel_rms(h, h_ref) < TOLERANCE[dtype]
    assert rel_rms(grad, grad_ref) < TOLERANCE[dtype]


def test_separate_tensors_small_values_and_other_caps():
    # Near 0 the tanh series branch is used; caps are parameters.
    gen = torch.Generator().manual_seed(1)
    gate = (1e-3 * torch.randn(1031, generator=gen)).requires_grad_()
    up = torch.randn(1031, generator=gen).requires_grad_()
    h = situ_glu_triton(gate, up, beta=2.0, linear_beta=3.0)
    grads = torch.autograd.grad(h.sum(), (gate, up))
    gate_ref, up_ref = (x.detach().double().requires_grad_() for x in (gate, up))
    h_ref = situ_glu(gate_ref, up_ref, beta=2.0, linear_beta=3.0)
    grads_ref = torch.autograd.grad(h_ref.sum(), (gate_ref, up_ref))
    assert rel_rms(h, h_ref) < 1e-6
    assert max(rel_rms(a, e) for a, e in zip(grads, grads_ref)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_inputs_are_bounded_and_finite(dtype):
    values = torch.tensor([-1e4, -50.0, -1.0, 0.0, 1.0, 50.0, 1e4])
    gate, up = torch.meshgrid(values, values, indexing="ij")
    gate, up = (x.to(dtype).contiguous().requires_grad_() for x in (gate, up))
    h = situ_glu_triton(gate, up)
    grads = torch.autograd.grad(h.sum(), (gate, up))
    assert h.isfinite().all() and all(x.isfinite().all() for x in grads)
    # |h| < beta1 * beta2 (architecture.md 6); both tanh factors round to 1 at |x| = 1e4.
    assert h.float().abs().max() <= 4.0 * 25.0


def test_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="up: expected shape"):
        situ_glu_triton(torch.zeros(4, 3), torch.zeros(4, 5))
