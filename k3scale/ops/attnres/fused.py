"""Attention Residuals on the fused C++ kernel (fused.cpp): the "cpu" backend's path.

`attn_res_fused(sources, query, key_norm_weight, eps)` returns what `models.attnres.attn_res`
does, without stacking the sources: each token's source rows are read in cache, about five
passes over the data forward and backward instead of some twenty. tests/ops/test_attnres_fused.py
compares outputs and every gradient (each source, the query and the key norm weight) with the
torch reference.
"""

from __future__ import annotations

import torch

from k3scale.ops.cpu import load, supports


def fused_supported(sources: list[torch.Tensor], query: torch.Tensor) -> bool:
    """Whether the kernel runs these inputs: built, CPU, fp32 or fp64 throughout, no autocast."""
    return supports(*sources, query)


def attn_res_fused(
    sources: list[torch.Tensor], query: torch.Tensor, key_norm_weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """`sum_j p_j V_j`, `p = softmax_j(<query * key_norm_weight, RMSNorm(V_j)>)` (see
    models/attnres.py); sources `[..., d]` of one shape, query and weight `[d]`."""
    u = query * key_norm_weight
    return _AttnRes.apply(u, float(eps), *(s.contiguous() for s in sources))


class _AttnRes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, eps, *sources):
        out, weights, rms = load().attnres_forward(list(sources), u.contiguous(), eps)
        ctx.save_for_backward(u, weights, rms, *sources)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        u, weights, rms, *sources = ctx.saved_tensors
        *grad_sources, grad_u = load().attnres_backward(
            grad_out, sources, u.contiguous(), weights, rms
        )
        return (grad_u, None, *grad_sources)
