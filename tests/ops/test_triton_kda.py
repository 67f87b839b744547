"""Triton KDA (`k3scale/ops/kda/triton.py`) vs the step-by-step reference, under the interpreter.

Forward output, final state and every gradient (q, k, v, g, beta, initial state) are compared with
`naive_recurrent_kda` run in fp64 on the same (dtype-rounded) inputs, for bounded (K3) and
unbounded (Kimi Linear) gates, T not a multiple of the chunk, odd K, K over 64 (the state kernels
split the state in key halves). Tiny shapes: the Triton
interpreter is ~1000x slower than compiled kernels.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.ops.triton_interpret import interpreted, launch_interpreted

# Triton reads TRITON_INTERPRET at import and when kernels are decorated (in this block) and
# at launch (the fixture below).
with interpreted() as SET_INTERPRET:
    pytest.importorskip("triton")
    from k3scale.ops.kda.chunk import chunk_kda
    from k3scale.ops.kda.naive import naive_recurrent_kda
    from k3scale.ops.kda.triton import chunk_kda_triton

pytestmark = pytest.mark.triton
interpret_triton = launch_interpreted(SET_INTERPRET)


# Relative RMS tolerances vs the fp64 reference. fp32: observed <= 1e-6 (fp32 cumulated decays and
# fp32 matmuls); bf16: the output and gradients are rounded to 8 mantissa bits (~3e-3 observed).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected||_rms / ||expected||_rms in fp64 (0 when both are zero)."""
    diff = (actual.double() - expected.double()).pow(2).mean().sqrt()
    return (diff / expected.double().pow(2).mean().sqrt().clamp_min(1e-30)).item()


@pytest.fixture(autouse=True)
def nan_filled_empty(monkeypatch):
    """Buffers from torch.empty start as NaN, so a kernel that skips an element fails loudly."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", empty)


def make_inputs(seq_len, d_key, d_value, gate, with_state, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batch, heads = 1, 2
    shape = (batch, seq_len, heads, d_key)
    q = F.normalize(torch.randn(*shape, generator=gen), dim=-1)
    k = F.normalize(torch.randn(*shape, generator=gen), dim=-1)
    v = torch.randn(batch, seq_len, heads, d_value, generator=gen)
    z = torch.randn(*shape, generator=gen)
    # K3 bounded gate g in (-5, 0); Kimi Linear's unbounded -exp(A) softplus(z), A up to ln 16.
    g = -5.0 * torch.sigmoid(z) if gate == "bounded" else -16.0 * F.softplus(z)
    beta = torch.sigmoid(torch.randn(batch, seq_len, heads, generator=gen))
    tensors = [q, k, v, g, beta]
    if with_state:
        tensors.append(torch.randn(batch, heads, d_key, d_value, generator=gen))
    return [x.to(dtype).requires_grad_() for x in tensors]


def run_with_grads(fn, inputs, cotangents, **kwargs):
    initial = inputs[5] if len(inputs) == 6 else None
    o, state = fn(*inputs[:5], initial_state=initial, output_final_state=True, **kwargs)
    grads = torch.autograd.grad((o, state), inputs, cotangents)
    return [o, state, *grads]


CASES = [
    # (T, K, V, gate, initial state, chunk, dtype)
    (1, 16, 16, "bounded", False, 16, torch.float32),
    (17, 16, 16, "bounded", True, 16, torch.float32),
    (33, 16, 24, "unbounded", True, 16, torch.float32),
    (40, 20, 16, "unbounded", False, 32, torch.float32),
    (33, 16, 16, "bounded", True, 16, torch.bfloat16),
    # K > 64: the state kernels hold the state as two key halves.
    (20, 72, 16, "unbounded", True, 16, torch.float32),
]


@pytest.mark.parametrize("seq_len, d_key, d_value, gate, with_state, chunk, dtype", CASES)
def test_forward_and_gradients_match_recurrence(
    seq_len, d_key, d_value, gate, with_state, chunk, dtype
):
    inputs = make_inputs(seq_len, d_key, d_value, gate, with_state, dtype)
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(inputs[2].shape, generator=gen).to(dtype)
    d_state = torch.randn(1, 2, d_key, d_value, generator=gen)
    actual = run_with_grads(chunk_kda_triton, inputs, (d_o, d_state), chunk_size=chunk)
    reference = [x.detach().double().requires_grad_() for x in inputs]
    expected = run_with_grads(naive_recurrent_kda, reference, (d_o.double(), d_state.double()))
    names = ["o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"]
    errors = {name: rel_rms(a, e) for name, a, e in zip(names, actual, expected)}
    assert max(errors.values()) < TOLERANCE[dtype], errors
    assert [x.dtype for x in actual[2:]] == [x.dtype for x in inputs]


def test_matches_torch_chunked_path_and_is_chunk_size_invariant():
    inputs = make_inputs(40, 16, 16, "bounded", True, torch.float32, seed=3)
    d_o = torch.randn(inputs[2].shape)
    d_state = torch.randn(1, 2, 16, 16)
    torch_path = run_with_grads(chunk_kda, inputs, (d_o, d_state), chunk_size=16)
    for chunk in (16, 64):
        triton_path = run_with_grads(chunk_kda_triton, inputs, (d_o, d_state), chunk_size=chunk)
        for actual, expected in zip(triton_path, torch_path):
            assert rel_rms(actual, expected) < 1e-5


def test_strong_unbounded_gates_stay_finite_and_accurate():
    inputs = make_inputs(33, 16, 16, "unbounded", False, torch.float32, seed=5)
    with torch.no_grad():
        # Half the channels forget within a token (log decay to ~ -1e3, where 1/Gamma would
        # overflow fp32), the other half barely decay, so every gradient stays informative.
        inputs[3].mul_(torch.where(torch.arange(16) < 8, 60.0, 0.05))
    d_o = torch.randn(inputs[2].shape)
    o, _ = chunk_kda_triton(*inputs, chunk_size=32)
    grads = torch.autograd.grad(o, inputs, d_o)
    reference = [x.detach().double().requires_grad_() for x in inputs]
    o_ref, _ = naive_recurrent_kda(*reference)
    grads_ref = torch.autograd.grad(o_ref, reference, d_o.double())
    assert all(x.isfinite().all() for x in (o, *grads))
    assert rel_rms(o, o_ref) < TOLERANCE[torch.float32]
    assert max(rel_rms(a, e) for a, e in zip(grads, grads_ref)) < TOLERANCE[torch.float32]


def test_rejects_bad_chunk_size_and_dtype():
    inputs = [x.detach() for x in make_inputs(17, 16, 16, "bounded", False, torch.float32)]
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_kda_triton(*inputs, chunk_size=24)
    with pytest.raises(ValueError, match="q: Triton KDA takes"):
        chunk_kda_triton(*(x.double() for x in inputs))
