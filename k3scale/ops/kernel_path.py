"""Which path a process's CPU ops take, as runs and studies record it. Apart from build.py so that
reading a record (`study report`) imports no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelPath:
    """Which path a process's CPU ops take: `fused` (the C++ kernels, built for `capability`) or
    `torch` (the plain torch ops, `reason` says why); logged with every run and study."""

    name: str
    capability: str
    reason: str | None = None

    def describe(self) -> str:
        if self.name == "fused":
            return f"fused CPU kernels ({self.capability})"
        return f"torch paths, fused CPU kernels off: {self.reason}"
