"""SiTU-GLU reference (K3 report Eq. 12; K3 config `activation_situ_beta=4.0`,
`activation_situ_linear_beta=25.0`).

SiTU_b(g) = b * tanh(g / b) * sigmoid(g): Swish with its linear factor soft-capped at b.
The up branch is capped independently: cap_b2(u) = b2 * tanh(u / b2). With b = 4 and b2 = 25,
|h| < 100 elementwise, so bf16 activations cannot overflow. Computed in fp32, cast back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def situ(gate: torch.Tensor, beta: float) -> torch.Tensor:
    """Capped Swish of the gate branch, fp32 inside."""
    g = gate.float()
    return (beta * torch.tanh(g / beta) * torch.sigmoid(g)).to(gate.dtype)


def situ_glu(
    gate: torch.Tensor, up: torch.Tensor, beta: float = 4.0, linear_beta: float | None = 25.0
) -> torch.Tensor:
    """h = SiTU_beta(gate) * cap_linear_beta(up); `linear_beta=None` leaves the up branch uncapped."""
    g = gate.float()
    u = up.float()
    capped_up = u if linear_beta is None else linear_beta * torch.tanh(u / linear_beta)
    h = beta * torch.tanh(g / beta) * torch.sigmoid(g) * capped_up
    return h.to(gate.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's h = SiLU(gate) * up (the K2 activation)."""
    return F.silu(gate) * up
