"""The GLU nonlinearity as the C++ kernels take it, and when they can run."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k3scale.ops.cpu.build import load

SWIGLU, SITU = 0, 1


@dataclass(frozen=True)
class KernelActivation:
    """`kind` SWIGLU or SITU; SiTU's gate cap `beta` and up cap `linear_beta` (<= 0: no cap)."""

    kind: int
    beta: float = 0.0
    linear_beta: float = 0.0

    def args(self) -> tuple[int, float, float]:
        return self.kind, self.beta, self.linear_beta


def supports(*tensors: torch.Tensor) -> bool:
    """Whether the kernels can run these tensors: built, CPU, one dtype of fp32/fp64, no autocast."""
    dtype = tensors[0].dtype
    return (
        dtype in (torch.float32, torch.float64)
        and all(t.device.type == "cpu" and t.dtype == dtype for t in tensors)
        and not torch.is_autocast_enabled("cpu")
        and kernels_loaded()
    )


@torch.compiler.assume_constant_result
def kernels_loaded() -> bool:
    """Whether the kernels are built and loaded in this process. Fixed once asked, so Dynamo
    takes its answer as a constant instead of tracing the build's capability check (a graph
    break per call, issue 34)."""
    return load() is not None
