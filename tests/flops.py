"""An independent FLOP count for tests: the profiler's own per-op estimate.

Not `torch.utils.flop_counter`: importing it imports Triton outside the interpreter, and the
Triton tests of this session then fail to launch their kernels.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile

# The ops the profiler estimates that are matrix products (it has no rule for in-place addmm_).
PROFILED_PRODUCTS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})


def profiled_matmul_flops(fn: Callable[[], object]) -> int:
    """FLOPs the profiler assigns to the matrix products `fn()` runs."""
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        fn()
    return sum(event.flops for event in prof.events() if event.name in PROFILED_PRODUCTS)
