"""Dense GLU feed-forward network (architecture.md sections 5.1 and 6).

`y = W_down act(W_gate x, W_up x)` with act = SwiGLU (`SiLU(g) * u`, K2) or SiTU-GLU
(`SiTU_b(g) * cap_b2(u)`, K3). Used for the dense layers; the MoE's shared experts have the same
shape (one GLU of width num_shared * d_expert).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from k3scale.models.common import linear
from k3scale.ops.backend import situ_glu_op
from k3scale.ops.cpu import SITU, SWIGLU, KernelActivation, supports
from k3scale.ops.situ import swiglu
from k3scale.ops.situ.cpu import glu_cpu


def kernel_activation(
    activation: str, situ_beta: float, situ_linear_beta: float | None, backend: str
) -> KernelActivation | None:
    """The same nonlinearity for the fused CPU kernels; None under the Triton backend (GPU
    runs keep the torch dispatch: the C++ kernels are CPU-only)."""
    if backend == "triton":
        return None
    if activation == "swiglu":
        return KernelActivation(SWIGLU)
    return KernelActivation(SITU, situ_beta, situ_linear_beta or 0.0)


class GLUFeedForward(nn.Module):
    """Gated FFN `[..., d_model] -> [..., d_model]` with children `w_gate, w_up, w_down`."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: Literal["swiglu", "situ"],
        situ_beta: float,
        situ_linear_beta: float | None,
        init_std: float,
        backend: str = "torch",
    ) -> None:
        """Args:
        d_model: input and output width.
        d_ff: hidden width of the gate and up branches.
        activation: "swiglu" or "situ".
        situ_beta: SiTU cap of the gate branch (K3: 4.0); used by "situ" only.
        situ_linear_beta: SiTU cap of the up branch (K3: 25.0), None for no cap.
        init_std: std of the normal weight init.
        backend: "cpu" or "torch" (SiTU-GLU through the fused C++ kernel on CPU when built,
            else torch ops) or "triton" (the fused SiTU-GLU Triton kernel).
        """
        super().__init__()
        if activation not in ("swiglu", "situ"):
            raise ValueError(f"activation: {activation!r} is not one of ['swiglu', 'situ']")
        self.activation = activation
        self.situ_beta = situ_beta
        self.situ_linear_beta = situ_linear_beta
        self._situ_glu = situ_glu_op(backend)
        self._kernel_activation = kernel_activation(
            activation, situ_beta, situ_linear_beta, backend
        )
        self.w_gate = linear(d_model, d_ff, init_std)
        self.w_up = linear(d_model, d_ff, init_std)
        self.w_down = linear(d_ff, d_model, init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x [..., d_model] -> [..., d_model]`."""
        gate, up = self.w_gate(x), self.w_up(x)
        if self.activation == "swiglu":
            # torch's own SiLU kernel matched the fused one here (fwd+bwd, 8K-700K elements).
            hidden = swiglu(gate, up)
        elif self._kernel_activation is not None and supports(gate, up):
            # SiTU in torch is ~10 elementwise ops; fused it ran 1.6-2.9x faster (1-2 threads).
            hidden = glu_cpu(gate, up, self._kernel_activation)
        else:
            hidden = self._situ_glu(gate, up, self.situ_beta, self.situ_linear_beta)
        return self.w_down(hidden)
