"""Fused CPU kernels: each op's C++ beside its Python wrapper (`ops/<op>/*.cpp`), shared helpers
in `common.h`, one extension built on first use by `build.py`."""

from k3scale.ops.cpu.activation import SITU, SWIGLU, KernelActivation, supports
from k3scale.ops.cpu.build import load, unavailable_reason

__all__ = ["SITU", "SWIGLU", "KernelActivation", "load", "supports", "unavailable_reason"]
