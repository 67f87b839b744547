"""Throughput and model FLOP utilisation against a matmul peak measured on this machine."""

from __future__ import annotations

import time
from functools import cache

import torch


@cache
def matmul_peak_flops(
    dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 0.3
) -> float:
    """Best achieved FLOP/s of square matmuls of `size` in `dtype` with the current threads."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        elapsed = time.perf_counter() - start
        best = max(best, 2 * size**3 / elapsed)
    return best


def mfu(flops_per_token: int, tokens_per_s: float, peak_flops: float) -> float:
    """Achieved model FLOP/s (from the accounting) divided by the measured peak."""
    return flops_per_token * tokens_per_s / peak_flops if peak_flops > 0 else 0.0
