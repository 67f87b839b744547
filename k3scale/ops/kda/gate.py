"""KDA decay gates (architecture.md section 1.2, steps 5-6): raw logits `z` -> log decay `g <= 0`.

Both gates add the per-channel bias `dt_bias` inside the activation and run in fp32 (fp64 for
fp64 logits, so fp64 tests stay fp64 end to end).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from k3scale.ops.kda.naive import compute_dtype


def _biased_logits(z: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """`z + dt_bias` in fp32/fp64, `dt_bias [H*K]` viewed as `[H, K]` to match `z [..., H, K]`."""
    num_heads, d_key = z.shape[-2:]
    if dt_bias.numel() != num_heads * d_key:
        raise ValueError(f"dt_bias: expected {num_heads * d_key} entries, got {dt_bias.numel()}")
    dtype = compute_dtype(z.dtype)
    return z.to(dtype) + dt_bias.to(dtype).view(num_heads, d_key)


def _head_rate(A_log: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """`exp(A_log)` as `[H, 1]`, broadcast over each head's channels of `z [..., H, K]`."""
    num_heads = z.shape[-2]
    if A_log.numel() != num_heads:
        raise ValueError(f"A_log: expected {num_heads} entries (one per head), got {A_log.numel()}")
    return A_log.to(compute_dtype(z.dtype)).exp().view(num_heads, 1)


def kda_gate_bounded(
    z: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float = -5.0
) -> torch.Tensor:
    """K3 gate `g = lower_bound * sigmoid(exp(A_log) * (z + dt_bias))`, in (lower_bound, 0).

    In fp32 the sigmoid saturates for |argument| > ~17 / ~100, so the returned values lie in
    the closed interval [lower_bound, 0]; exp(g) >= exp(lower_bound) always holds.

    Args:
        z: raw decay logits `[..., H, K]`.
        A_log: per-head log rate `[H]` (K3 init 0).
        dt_bias: per-channel bias `[H * K]`.
        lower_bound: g_min; K3 config `lower_bound = -5`.

    Returns:
        Log decay `[..., H, K]` in fp32 (fp64 for fp64 `z`).
    """
    rate = _head_rate(A_log, z)
    return lower_bound * torch.sigmoid(rate * _biased_logits(z, dt_bias))


def kda_gate_softplus(z: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Kimi Linear gate `g = -exp(A_log) * softplus(z + dt_bias)`, unbounded below, <= 0.

    Args:
        z: raw decay logits `[..., H, K]`.
        A_log: per-head log rate `[H]` (Kimi Linear init ln U(1, 16)).
        dt_bias: per-channel bias `[H * K]`.

    Returns:
        Log decay `[..., H, K]` in fp32 (fp64 for fp64 `z`).
    """
    rate = _head_rate(A_log, z)
    return -rate * F.softplus(_biased_logits(z, dt_bias))
