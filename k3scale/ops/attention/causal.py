"""Causal softmax attention on the fused C++ kernel (causal.cpp): MLA's path under the "cpu"
backend at the study ladders' head widths.

At head widths 4-12 torch's CPU flash kernel spent about 60% of a K2 training step (k2-s3, batch
8 x 256 tokens, one thread) in GEMM tiles whose inner dimension is the head width. The kernel
here works one (sequence, head) at a time with the keys and values transposed in cache and
vectorises across key positions; the backward recomputes the probabilities from the saved
log-sum-exp. Inputs stay in the projections' `[B, T, H, D]` layout. tests/ops/test_attention.py
compares outputs and every gradient with torch's `scaled_dot_product_attention`.
"""

from __future__ import annotations

import torch

from k3scale.ops.cpu import load, supports

# Widest head the kernel takes. `k3scale bench train` (one thread, batch 16 x 256): with it,
# k2-d48 (q/k 12, v 8) ran 1.59x the reference against 1.43x with padded flash; at k2-d64 (q/k 24,
# v 16) it ran 1.05x against flash's 1.16x, so wider heads keep torch's flash kernel (measured
# before the kernel ran four FMA chains at once; the v2 ladders' heads are all 4-12 wide).
MAX_HEAD_WIDTH = 16


def fused_supported(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Built, CPU, fp32/fp64, no autocast, heads no wider than MAX_HEAD_WIDTH."""
    return max(q.shape[-1], v.shape[-1]) <= MAX_HEAD_WIDTH and supports(q, v)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`softmax(scale q k^T + causal mask) v` per head: q, k `[B, T, H, Dk]`, v `[B, T, H, Dv]`
    -> `[B, T, H, Dv]`, and the largest logit `scale q_i . k_j` (j <= i) per sequence and head,
    `[B, H]` (not differentiable): what QK-Clip tracks, which the forward computes anyway."""
    return _CausalAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), float(scale))


class _CausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale):
        out, lse, head_max = load().causal_attention_forward(q, k, v, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(head_max)
        ctx.scale = scale
        return out, head_max

    @staticmethod
    def backward(ctx, grad_out, _grad_head_max):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = load().causal_attention_backward(grad_out, q, k, v, out, lse, ctx.scale)
        return dq, dk, dv, None
