"""GLU activations (SwiGLU, SiTU-GLU) through the fused C++ kernel (glu.cpp, math in glu.h): one
elementwise pass forward, one for both gradients, where torch autograd takes about 4 and 10 ops.
References: `naive.py`."""

from __future__ import annotations

import torch

from k3scale.ops.cpu import KernelActivation, load


def glu_cpu(gate: torch.Tensor, up: torch.Tensor, activation: KernelActivation) -> torch.Tensor:
    """`h = act(gate, up)`; needs `ops.cpu.supports(gate, up)`. Math in the input dtype."""
    return _Glu.apply(gate.contiguous(), up.contiguous(), activation)


class _Glu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, activation):
        ctx.save_for_backward(gate, up)
        ctx.activation = activation
        return load().glu_forward(gate, up, *activation.args())

    @staticmethod
    def backward(ctx, grad_out):
        gate, up = ctx.saved_tensors
        grad_gate, grad_up = load().glu_backward(
            gate, up, grad_out.contiguous(), *ctx.activation.args()
        )
        return grad_gate, grad_up, None
