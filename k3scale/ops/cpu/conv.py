"""KDA's short convolution and SiLU on the fused C++ kernel (conv.cpp), in the projections'
`[B, T, P]` layout. The torch reference is `models/kda._causal_conv_silu_torch`;
tests/ops/test_cpu_kernels.py compares outputs and every gradient."""

from __future__ import annotations

import torch

from k3scale.ops.cpu.build import load
from k3scale.ops.members import loop_members


def conv_silu_fused(padded: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`silu(y)`, `y[b, t] = sum_k weight[:, k] * padded[b, t + k]`, for padded `[B, T + K - 1,
    P]` (the previous K - 1 inputs, then this call's) and weight `[P, K]`; returns `[B, T, P]`."""
    return conv_silu_forward(padded.contiguous(), weight.contiguous())[0]


# Custom ops (torch.compile traces each as one node; a pybind call would break its graph).
@torch.library.custom_op("k3scale::conv_silu_forward", mutates_args=())
def conv_silu_forward(
    padded: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu(y), y), both `[B, T, P]`: the backward takes the pre-activation."""
    return tuple(load().conv_silu_forward(padded, weight))


@conv_silu_forward.register_fake
def _(padded, weight):
    batch, padded_steps, width = padded.shape
    shape = (batch, padded_steps - weight.shape[1] + 1, width)
    return padded.new_empty(shape), padded.new_empty(shape)


@torch.library.custom_op("k3scale::conv_silu_backward", mutates_args=())
def conv_silu_backward(
    grad_out: torch.Tensor, padded: torch.Tensor, weight: torch.Tensor, pre: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_padded, grad_weight)."""
    return tuple(load().conv_silu_backward(grad_out, padded, weight, pre))


@conv_silu_backward.register_fake
def _(grad_out, padded, weight, pre):
    return padded.new_empty(padded.shape), weight.new_empty(weight.shape)


def _save(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[1])


def _backward(ctx, grad_out, _grad_pre):
    return conv_silu_backward(grad_out.contiguous(), *ctx.saved_tensors)


conv_silu_forward.register_autograd(_backward, setup_context=_save)

# Stacked trials call the op under vmap (ops/members.py).
torch.library.register_vmap(conv_silu_forward, loop_members(conv_silu_forward))
