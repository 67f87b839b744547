"""GLU activations (SwiGLU, SiTU-GLU) through the fused C++ kernel (glu.cpp, math in glu.h): one
elementwise pass forward, one for both gradients, where torch autograd takes about 4 and 10 ops.
References: `naive.py`."""

from __future__ import annotations

import torch

from k3scale.ops.cpu import KernelActivation, load
from k3scale.ops.members import fold_members


def glu_cpu(gate: torch.Tensor, up: torch.Tensor, activation: KernelActivation) -> torch.Tensor:
    """`h = act(gate, up)`; needs `ops.cpu.supports(gate, up)`. Math in the input dtype."""
    return glu_forward(gate.contiguous(), up.contiguous(), *activation.args())


# Custom ops (torch.compile traces each as one node; a pybind call would break its graph).
@torch.library.custom_op("k3scale::glu_forward", mutates_args=())
def glu_forward(
    gate: torch.Tensor, up: torch.Tensor, kind: int, beta: float, linear_beta: float
) -> torch.Tensor:
    """`act(gate, up)` for the activation `KernelActivation(kind, beta, linear_beta)`."""
    return load().glu_forward(gate, up, kind, beta, linear_beta)


@glu_forward.register_fake
def _(gate, up, kind, beta, linear_beta):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("k3scale::glu_backward", mutates_args=())
def glu_backward(
    gate: torch.Tensor,
    up: torch.Tensor,
    grad_out: torch.Tensor,
    kind: int,
    beta: float,
    linear_beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_gate, grad_up) in one pass."""
    return tuple(load().glu_backward(gate, up, grad_out, kind, beta, linear_beta))


@glu_backward.register_fake
def _(gate, up, grad_out, kind, beta, linear_beta):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _save(ctx, inputs, output):
    gate, up, *activation = inputs
    ctx.save_for_backward(gate, up)
    ctx.activation = activation


def _backward(ctx, grad_out):
    gate, up = ctx.saved_tensors
    grads = glu_backward(gate, up, grad_out.contiguous(), *ctx.activation)
    return (*grads, None, None, None)


glu_forward.register_autograd(_backward, setup_context=_save)

# Stacked trials call the op under vmap (ops/members.py).
torch.library.register_vmap(glu_forward, fold_members(glu_forward))
