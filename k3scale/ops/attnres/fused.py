"""Attention Residuals on the fused C++ kernel (fused.cpp): the "cpu" backend's path.

`attn_res_fused(sources, query, key_norm_weight, eps)` returns what `models.attnres.attn_res`
does, without stacking the sources: each token's source rows are read in cache, about five
passes over the data forward and backward instead of some twenty. tests/ops/test_attnres_fused.py
compares outputs and every gradient (each source, the query and the key norm weight) with the
torch reference. Forward and backward are `torch.library` custom ops (`k3scale::attnres_forward`,
`k3scale::attnres_backward`), so `torch.compile` traces each as a single graph node.
"""

from __future__ import annotations

import torch

from k3scale.ops.cpu import load, supports
from k3scale.ops.members import loop_members


def fused_supported(sources: list[torch.Tensor], query: torch.Tensor) -> bool:
    """Whether the kernel runs these inputs: built, CPU, fp32 or fp64 throughout, no autocast."""
    return supports(*sources, query)


def attn_res_fused(
    sources: list[torch.Tensor], query: torch.Tensor, key_norm_weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """`sum_j p_j V_j`, `p = softmax_j(<query * key_norm_weight, RMSNorm(V_j)>)` (see
    models/attnres.py); sources `[..., d]` of one shape, query and weight `[d]`."""
    u = query * key_norm_weight
    out, _, _ = attnres_forward([s.contiguous() for s in sources], u.contiguous(), float(eps))
    return out


# Custom ops, not an autograd.Function calling the extension: `torch.compile` traces through
# them as single nodes (their fake kernels give the shapes) instead of breaking the graph at the
# pybind call (issue 34).
@torch.library.custom_op("k3scale::attnres_forward", mutates_args=())
def attnres_forward(
    sources: list[torch.Tensor], u: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out `[..., d]`, weights `[N, rows]`, key rms `[N, rows]`), N sources of `rows * d`
    elements each; weights and rms are what the backward needs."""
    return tuple(load().attnres_forward(sources, u, eps))


@attnres_forward.register_fake
def _(sources, u, eps):
    rows = sources[0].numel() // u.shape[0]
    return (
        sources[0].new_empty(sources[0].shape),
        u.new_empty(len(sources), rows),
        u.new_empty(len(sources), rows),
    )


@torch.library.custom_op("k3scale::attnres_backward", mutates_args=())
def attnres_backward(
    grad_out: torch.Tensor,
    sources: list[torch.Tensor],
    u: torch.Tensor,
    weights: torch.Tensor,
    rms: torch.Tensor,
) -> list[torch.Tensor]:
    """[dV_1, ..., dV_N, du]."""
    return load().attnres_backward(grad_out, sources, u, weights, rms)


@attnres_backward.register_fake
def _(grad_out, sources, u, weights, rms):
    return [s.new_empty(s.shape) for s in sources] + [u.new_empty(u.shape)]


def _save(ctx, inputs, output):
    sources, u, _ = inputs
    ctx.save_for_backward(u, output[1], output[2], *sources)


def _backward(ctx, grad_out, _grad_weights, _grad_rms):
    u, weights, rms, *sources = ctx.saved_tensors
    *grad_sources, grad_u = attnres_backward(grad_out, sources, u, weights, rms)
    return grad_sources, grad_u, None


attnres_forward.register_autograd(_backward, setup_context=_save)

# Stacked trials call the op under vmap (ops/members.py).
torch.library.register_vmap(attnres_forward, loop_members(attnres_forward))
