"""Sorted expert dispatch (ops/moe/dispatch.py) against the dense masked reference (naive.py):
outputs and every gradient, both grouped methods, odd token counts, empty experts, bf16."""

from __future__ import annotations

import functools

import pytest
import torch

from k3scale.ops.moe import routed_experts, routed_experts_naive
from k3scale.ops.situ import situ_glu, swiglu

ACTIVATIONS = {"swiglu": swiglu, "situ": functools.partial(situ_glu, beta=4.0, linear_beta=25.0)}


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach(), expected.detach()
    diff = (actual.double() - expected.double()).pow(2).mean().sqrt()
    return float(diff / expected.double().pow(2).mean().sqrt().clamp_min(1e-30))


def random_problem(num_tokens, num_experts, top_k, width=16, d_ff=12, seed=0, avoid=()):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(num_tokens, num_experts, generator=gen)
    scores[:, list(avoid)] = -1.0
    expert_idx = scores.argsort(dim=-1, descending=True)[:, :top_k]
    return {
        "x": torch.randn(num_tokens, width, generator=gen),
        "expert_idx": expert_idx,
        "weights": torch.rand(num_tokens, top_k, generator=gen),
        "w_gate": torch.randn(num_experts, d_ff, width, generator=gen) * 0.3,
        "w_up": torch.randn(num_experts, d_ff, width, generator=gen) * 0.3,
        "w_down": torch.randn(num_experts, width, d_ff, generator=gen) * 0.3,
    }


DIFFERENTIABLE = ("x", "weights", "w_gate", "w_up", "w_down")


def outputs_and_grads(fn, problem, activation, dtype=torch.float32, **kwargs):
    leaves = {
        name: (t.to(dtype) if name != "expert_idx" else t).requires_grad_(name in DIFFERENTIABLE)
        for name, t in ((n, v.clone()) for n, v in problem.items())
    }
    out = fn(**leaves, activation=activation, **kwargs)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    (out * cotangent).sum().backward()
    return out, {name: leaves[name].grad for name in DIFFERENTIABLE}


@pytest.mark.parametrize("method", ["padded", "loop", "auto"])
@pytest.mark.parametrize("activation", ["swiglu", "situ"])
@pytest.mark.parametrize(
    ("num_tokens", "num_experts", "top_k"), [(63, 5, 2), (100, 8, 3), (7, 4, 1)]
)
def test_dispatch_matches_dense_reference_fp32(method, activation, num_tokens, num_experts, top_k):
    problem = random_problem(num_tokens, num_experts, top_k)
    act = ACTIVATIONS[activation]
    ref, ref_grads = outputs_and_grads(routed_experts_naive, problem, act)
    out, grads = outputs_and_grads(routed_experts, problem, act, method=method)
    assert rel_rms(out, ref) < 1e-5
    for name in DIFFERENTIABLE:
        assert rel_rms(grads[name], ref_grads[name]) < 1e-5, name


@pytest.mark.parametrize("method", ["padded", "loop"])
def test_dispatch_with_empty_experts(method):
    problem = random_problem(63, 8, 2, avoid=(0, 5))
    assert not torch.isin(problem["expert_idx"], torch.tensor([0, 5])).any()
    ref, ref_grads = outputs_and_grads(routed_experts_naive, problem, swiglu)
    out, grads = outputs_and_grads(routed_experts, problem, swiglu, method=method)
    assert rel_rms(out, ref) < 1e-5
    for name in DIFFERENTIABLE:
        assert rel_rms(grads[name], ref_grads[name]) < 1e-5, name
    # Experts that got no token get an exactly zero gradient.
    assert torch.count_nonzero(grads["w_gate"][[0, 5]]) == 0


@pytest.mark.parametrize("method", ["padded", "loop"])
def test_dispatch_bf16_close_to_fp32_reference(method):
    problem = random_problem(100, 6, 2, width=32, d_ff=24)
    act = ACTIVATIONS["situ"]
    ref, ref_grads = outputs_and_grads(routed_experts_naive, problem, act)
    out, grads = outputs_and_grads(
        routed_experts, problem, act, dtype=torch.bfloat16, method=method
    )
    assert out.dtype == torch.bfloat16
    # bf16 keeps 8 mantissa bits (relative rounding 2**-9 per op); a few ops compound.
    assert rel_rms(out, ref) < 2e-2
    for name in DIFFERENTIABLE:
        assert rel_rms(grads[name], ref_grads[name]) < 3e-2, name


def test_dispatch_detects_wrong_weights():
    problem = random_problem(63, 5, 2)
    ref = routed_experts_naive(**problem, activation=swiglu)
    swapped = dict(problem, weights=problem["weights"].flip(-1))
    assert rel_rms(routed_experts(**swapped, activation=swiglu), ref) > 1e-2


def test_dispatch_rejects_unknown_method():
    with pytest.raises(ValueError, match="method"):
        routed_experts(**random_problem(10, 4, 2), activation=swiglu, method="dense")
