"""Rotary position embedding (RoPE) for MLA's decoupled q/k tail (K2).

Layout: **adjacent pairs**, as in DeepSeek-V3's reference (a complex view of the tail). Channels
`(2m, 2m+1)` form the complex number `x_{2m} + i x_{2m+1}`, which is multiplied by
`exp(i * p * omega_m)` at position `p`, with `omega_m = theta^(-2m / d_rope)` for
`m = 0 .. d_rope/2 - 1`. Because rotations compose, `<R_i q, R_j k>` depends on `i - j` only.
"""

from __future__ import annotations

import torch


def rope_cos_sin(
    positions: torch.Tensor, d_rope: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and sines of the rotation angles.

    Args:
        positions: Long or float `[T]` token positions.
        d_rope: Rotated width (even).
        theta: RoPE base (K2 config `rope_theta = 5e4`).
        dtype: Compute dtype of the angles (fp32, or fp64 for exact tests).

    Returns:
        `(cos, sin)`, each `[T, d_rope // 2]` in `dtype`.
    """
    pair_index = torch.arange(0, d_rope, 2, device=positions.device, dtype=dtype)
    inv_freq = theta ** (-pair_index / d_rope)
    angles = positions.to(dtype)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent channel pairs of `x` by the per-position angles.

    Args:
        x: `[B, T, H, d_rope]` (H may be 1 for MLA's shared key tail).
        cos: `[T, d_rope // 2]` from `rope_cos_sin`.
        sin: `[T, d_rope // 2]`.

    Returns:
        `[B, T, H, d_rope]` in `x.dtype`; computed in at least fp32.
    """
    compute = torch.promote_types(x.dtype, torch.float32)
    pairs = x.to(compute).unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    # [T, d/2] -> [T, 1, d/2]: one angle per (position, pair), shared by all heads.
    cos = cos.to(compute)[:, None, :]
    sin = sin.to(compute)[:, None, :]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)
