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
from k3scale.ops.members import fold_members

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
    out, _, head_max = attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), scale)
    return out, head_max


# Custom ops, not an autograd.Function calling the extension: `torch.compile` traces through
# them as single nodes (their fake kernels give the shapes) instead of breaking the graph at the
# pybind call (issue 34).
@torch.library.custom_op("k3scale::causal_attention_forward", mutates_args=())
def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out `[B, T, H, Dv]`, log-sum-exp `[B, H, T]`, largest logit `[B, H]`)."""
    return tuple(load().causal_attention_forward(q, k, v, scale))


@attention_forward.register_fake
def _(q, k, v, scale):
    batch, steps, heads, _ = q.shape
    return v.new_empty(v.shape), q.new_empty(batch, heads, steps), q.new_empty(batch, heads)


@torch.library.custom_op("k3scale::causal_attention_backward", mutates_args=())
def attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), the probabilities recomputed from the saved log-sum-exp."""
    return tuple(load().causal_attention_backward(grad_out, q, k, v, out, lse, scale))


@attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _save(ctx, inputs, output):
    q, k, v, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1])
    ctx.scale = scale


def _backward(ctx, grad_out, _grad_lse, _grad_head_max):
    q, k, v, out, lse = ctx.saved_tensors
    return (*attention_backward(grad_out.contiguous(), q, k, v, out, lse, ctx.scale), None)


attention_forward.register_autograd(_backward, setup_context=_save)

# Stacked trials call the op under vmap (ops/members.py).
torch.library.register_vmap(attention_forward, fold_members(attention_forward))
