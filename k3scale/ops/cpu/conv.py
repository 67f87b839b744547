"""KDA's short convolution and SiLU on the fused C++ kernel (conv.cpp), in the projections'
`[B, T, P]` layout. The torch reference is `models/kda._causal_conv_silu_torch`;
tests/ops/test_cpu_kernels.py compares outputs and every gradient."""

from __future__ import annotations

import torch

from k3scale.ops.cpu.build import load


def conv_silu_fused(padded: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`silu(y)`, `y[b, t] = sum_k weight[:, k] * padded[b, t + k]`, for padded `[B, T + K - 1,
    P]` (the previous K - 1 inputs, then this call's) and weight `[P, K]`; returns `[B, T, P]`."""
    return _ConvSilu.apply(padded.contiguous(), weight.contiguous())


class _ConvSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, padded, weight):
        out, pre = load().conv_silu_forward(padded, weight)
        ctx.save_for_backward(padded, weight, pre)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grad_padded, grad_weight = load().conv_silu_backward(grad_out, *ctx.saved_tensors)
        return grad_padded, grad_weight
