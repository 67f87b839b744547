"""Throughput and model FLOP utilisation against a matmul peak measured on this machine."""

from __future__ import annotations

import time
from functools import cache

import torch

# Side of the square matmuls of the peak probe, by device type: 1024 keeps the CPU probe short;
# a GPU needs far larger products to come near its peak (8192 as in benchmarks/gpu_check.py).
PEAK_MATMUL_SIZE = {"cpu": 1024, "cuda": 8192}


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on a GPU, so a timer read next covers it (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_bytes(device: torch.device | str) -> int | None:
    """Most bytes the CUDA allocator has held on `device` since the last reset; None on CPU."""
    if torch.device(device).type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device)


def measure_matmul_peak(
    dtype: torch.dtype = torch.float32,
    size: int | None = None,
    seconds: float = 0.3,
    device: torch.device | str = "cpu",
) -> float:
    """Best achieved FLOP/s of square `size` matmuls in `dtype` on `device` over `seconds`.

    Uses the current `torch.get_num_threads()` on CPU; one warm-up product is not timed. `size`
    defaults to `PEAK_MATMUL_SIZE` of the device type.
    """
    device = torch.device(device)
    size = size or PEAK_MATMUL_SIZE.get(device.type, PEAK_MATMUL_SIZE["cpu"])
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.mm(a, b)
    synchronize(device)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        elapsed = time.perf_counter() - start
        best = max(best, 2 * size**3 / elapsed)
    return best


def matmul_peak_flops(
    dtype: torch.dtype = torch.float32,
    size: int | None = None,
    seconds: float = 0.3,
    device: torch.device | str = "cpu",
) -> float:
    """`measure_matmul_peak`, measured once per process for each device, thread count and dtype."""
    return _cached_peak(dtype, size, seconds, torch.get_num_threads(), torch.device(device))


@cache
def _cached_peak(
    dtype: torch.dtype, size: int | None, seconds: float, num_threads: int, device: torch.device
) -> float:
    # num_threads is part of the key only: the peak scales with it (about 2x from 1 to 2 threads).
    return measure_matmul_peak(dtype, size, seconds, device)


def mfu(flops_per_token: int, tokens_per_s: float, peak_flops: float) -> float:
    """Achieved model FLOP/s (from the accounting) divided by the measured peak."""
    return flops_per_token * tokens_per_s / peak_flops if peak_flops > 0 else 0.0
