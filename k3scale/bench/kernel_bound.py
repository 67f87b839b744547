"""How fast a training step could be if it were nothing but its compute, each piece run alone.

`gemm_bound` prices every FLOP at the rate of the step's aten GEMMs. The fused C++ kernels
(causal attention, the MoE layers, GLU, AttnRes, the KDA conv) do much of the work at the study
shapes, at rates of their own. `record_compute` runs a function once, noting its aten GEMMs as
`gemm_bound` does and every call into the C++ kernels with a copy of its arguments;
`time_compute` then times each call alone on its copy (the GEMMs on fresh tensors of the same
layout) and sums. The sum is the step's time if nothing ran between its GEMMs and kernels and
none suffered from what ran before it; a measured step over it is the share of the step spent
in compute at the speed today's kernels reach. GEMMs a kernel runs inside its call are counted
with the kernel, not twice.
"""

from __future__ import annotations

import math
import types
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from k3scale.bench.gemm_bound import GemmCall, GemmRecorder, best_seconds_per_call, time_gemms
from k3scale.ops.cpu.build import load


@dataclass(frozen=True, eq=False)
class KernelCall:
    """One call into the C++ kernels: its name, the function and a copy of its arguments."""

    name: str
    fn: Callable
    args: tuple
    kwargs: dict

    def layout(self) -> tuple:
        """What the call's time depends on: the name, tensor layouts, other values by type or
        value. Calls with equal layouts are timed once."""
        return (self.name, _layout(self.args), _layout(tuple(self.kwargs.items())))

    def run_alone(self) -> Callable[[], object]:
        return lambda: self.fn(*self.args, **self.kwargs)


def _layout(value) -> object:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, list | tuple):
        return tuple(_layout(v) for v in value)
    if isinstance(value, bool | int | float | str | None):
        return value
    return type(value).__name__


def _copy(value):
    """A copy a later call cannot disturb: tensors cloned (layout kept), containers rebuilt."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list | tuple):
        return type(value)(_copy(v) for v in value)
    return value


@contextmanager
def _kernels_recorded(calls: list[KernelCall], gemms: GemmRecorder) -> Iterator[None]:
    """Every C++ kernel function notes its calls while inside; the module is restored after."""
    module = load()
    if module is None:  # no kernels here: the step is aten alone
        yield
        return
    originals = {
        name: fn
        for name, fn in vars(module).items()
        if not name.startswith("_") and isinstance(fn, types.BuiltinFunctionType)
    }

    def recording(name: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            calls.append(KernelCall(name, fn, _copy(args), _copy(kwargs)))
            gemms.paused += 1
            try:
                return fn(*args, **kwargs)
            finally:
                gemms.paused -= 1

        return call

    try:
        for name, fn in originals.items():
            setattr(module, name, recording(name, fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


def record_compute(fn: Callable[[], object]) -> tuple[list[GemmCall], list[KernelCall]]:
    """The aten GEMMs and the C++ kernel calls `fn()` makes, in order."""
    kernels: list[KernelCall] = []
    gemms = GemmRecorder()
    with gemms, _kernels_recorded(kernels, gemms):
        fn()
    return gemms.calls, kernels


def time_kernels(calls: list[KernelCall], seconds_per_call: float = 0.03) -> dict[str, float]:
    """Seconds of every recorded kernel call run alone, summed per kernel name (calls with the
    same layout timed once)."""
    by_layout: dict[tuple, KernelCall] = {}
    counts: Counter = Counter()
    for call in calls:
        layout = call.layout()
        by_layout.setdefault(layout, call)
        counts[layout] += 1
    seconds: dict[str, float] = {}
    for layout, call in by_layout.items():
        alone = best_seconds_per_call(call.run_alone(), seconds_per_call)
        seconds[call.name] = seconds.get(call.name, 0.0) + counts[layout] * alone
    return seconds


def time_compute(fn: Callable[[], object], seconds_per_call: float = 0.03) -> dict:
    """Record `fn` once, then time its pieces alone.

    Returns:
        `{"seconds": GEMMs plus kernels, "gemm_seconds", "kernel_seconds": {name: s},
        "gemm_calls", "kernel_calls"}`.
    """
    gemm_calls, kernel_calls = record_compute(fn)
    gemms = time_gemms(gemm_calls, seconds_per_call) if gemm_calls else {"seconds": 0.0}
    kernels = time_kernels(kernel_calls, seconds_per_call)
    total = gemms["seconds"] + math.fsum(kernels.values())
    return {
        "seconds": total,
        "gemm_seconds": gemms["seconds"],
        "kernel_seconds": kernels,
        "gemm_calls": len(gemm_calls),
        "kernel_calls": len(kernel_calls),
    }
