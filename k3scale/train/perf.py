"""Throughput and model FLOP utilisation against a matmul peak measured on this machine."""

from __future__ import annotations

import time
from functools import cache

import torch


def measure_matmul_peak(
    dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 0.3
) -> float:
    """Best achieved FLOP/s of square `size` matmuls in `dtype` over `seconds`, measured now.

    Uses the current `torch.get_num_threads()`; one warm-up product is not timed.
    """
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


def matmul_peak_flops(
    dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 0.3
) -> float:
    """`measure_matmul_peak`, measured once per process for each thread count and dtype."""
    return _cached_peak(dtype, size, seconds, torch.get_num_threads())


@cache
def _cached_peak(dtype: torch.dtype, size: int, seconds: float, num_threads: int) -> float:
    # num_threads is part of the key only: the peak scales with it (about 2x from 1 to 2 threads).
    return measure_matmul_peak(dtype, size, seconds)


def mfu(flops_per_token: int, tokens_per_s: float, peak_flops: float) -> float:
    """Achieved model FLOP/s (from the accounting) divided by the measured peak."""
    return flops_per_token * tokens_per_s / peak_flops if peak_flops > 0 else 0.0
