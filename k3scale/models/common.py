"""Blocks shared by both families: RMSNorm and weight init."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """`w * x / sqrt(mean(x^2) + eps)` over the last dim, computed in (at least) fp32, cast back."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp64 inputs stay fp64 so reference tests can be exact; bf16/fp16 are upcast to fp32.
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.weight.to(wide.dtype)).to(x.dtype)


def init_linear(layer: nn.Linear, std: float) -> nn.Linear:
    """N(0, std) weights and zero bias (fla and HF ports: std = initializer_range = 0.02)."""
    nn.init.normal_(layer.weight, mean=0.0, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def linear(d_in: int, d_out: int, std: float, bias: bool = False) -> nn.Linear:
    """A bias-free (by default) linear layer with the normal init."""
    return init_linear(nn.Linear(d_in, d_out, bias=bias), std)
