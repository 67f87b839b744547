"""How fast a training step could be if it were nothing but its GEMMs, each run alone.

`record_gemms` runs a function under a dispatch mode that notes every aten matrix product
(`mm`, `addmm`, `bmm`, `baddbmm` and their in-place and `out=` forms) with the shapes, strides
and dtypes of its operands. `time_gemms` then runs each distinct call on fresh tensors of the
same layout, alone and hot in cache, and sums the best per-call time over the recorded calls.

The sum is an optimistic bound on the step's time with these GEMMs: everything between them
costs nothing and no GEMM suffers from what ran before it. Products inside k3scale's own C++
kernels (the MoE experts, the KDA conv) are not aten calls and do not appear, so for models
with them the bound is looser still.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._library import custom_ops
from torch.utils._python_dispatch import TorchDispatchMode

GEMM_OPS = frozenset({"mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_"})


@dataclass(frozen=True)
class TensorSpec:
    """Layout of one operand: enough to rebuild a tensor the GEMM runs on the same way."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def build(self) -> torch.Tensor:
        # Through a flat buffer, so expanded (stride-0) operands keep their layout too.
        size = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True))
        return torch.randn(size).to(self.dtype).as_strided(self.shape, self.stride)


@dataclass(frozen=True)
class GemmCall:
    """One recorded matrix product: the op, its arguments (tensors as specs) and its FLOPs."""

    op: torch._ops.OpOverload
    args: tuple
    kwargs: tuple[tuple[str, object], ...]
    flops: int

    def run_alone(self) -> Callable[[], object]:
        """A closure calling the op on fresh tensors of the recorded layouts."""

        def build(value):
            return value.build() if isinstance(value, TensorSpec) else value

        args = [build(a) for a in self.args]
        kwargs = {k: build(v) for k, v in self.kwargs}
        return lambda: self.op(*args, **kwargs)


def _spec(value):
    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(value.shape), tuple(value.stride()), value.dtype)
    return value


def _product_flops(tensors: list[TensorSpec]) -> int:
    """2·M·K·N (per batch entry); the factors are the last two positional tensors of every
    form (`out=` travels as a keyword)."""
    left, right = tensors[-2:]
    return 2 * math.prod(left.shape) * right.shape[-1]


class GemmRecorder(TorchDispatchMode):
    """Notes every aten GEMM while active, except while `paused` is above zero (a caller timing
    an enclosing call some other way)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[GemmCall] = []
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "k3scale":
            # A custom op is one call to a dispatch mode, which would miss the aten GEMMs in its
            # body (the head loss's chunk GEMMs): run its Python body under this mode instead.
            with self:
                return custom_ops.OPDEFS[func.name()]._init_fn(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in GEMM_OPS and not self.paused:
            specs = tuple(_spec(a) for a in args)
            factors = [s for s in specs if isinstance(s, TensorSpec)]
            self.calls.append(
                GemmCall(
                    op=func,
                    args=specs,
                    kwargs=tuple(sorted((k, _spec(v)) for k, v in kwargs.items())),
                    flops=_product_flops(factors),
                )
            )
        return func(*args, **kwargs)


def record_gemms(fn: Callable[[], object]) -> list[GemmCall]:
    """Every aten GEMM `fn()` runs, in order."""
    recorder = GemmRecorder()
    with recorder:
        fn()
    return recorder.calls


def best_seconds_per_call(run: Callable[[], object], seconds: float) -> float:
    """The best mean time per call of `run` over three windows of `seconds / 3` (after one
    warm-up call): the call alone and hot in cache."""
    run()
    best = math.inf
    for _ in range(3):
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 3 or count == 0:
            run()
            count += 1
        best = min(best, elapsed / count)
    return best


def time_gemms(calls: list[GemmCall], seconds_per_call: float = 0.03) -> dict:
    """Sum of the best alone-time of every recorded call (distinct calls timed once).

    Returns:
        `{"seconds": s, "flops": total FLOPs, "calls": n, "distinct": n}`.
    """
    counts = Counter(calls)
    seconds = sum(
        n * best_seconds_per_call(call.run_alone(), seconds_per_call) for call, n in counts.items()
    )
    return {
        "seconds": seconds,
        "flops": sum(call.flops for call in calls),
        "calls": len(calls),
        "distinct": len(counts),
    }
