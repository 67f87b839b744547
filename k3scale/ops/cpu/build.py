"""Build and load `kernels.cpp` with torch's extension builder (g++ and ninja), once per machine.

The first call compiles into torch's extension cache (`TORCH_EXTENSIONS_DIR`, default
`~/.cache/torch_extensions`; about a minute on 2 cores) under a file lock, so concurrent Ray
workers build once; later processes only load the cached library. `K3SCALE_CPU_KERNELS=0` turns
the kernels off (callers fall back to the plain torch paths). If the build fails, the reason is
logged once and the torch paths are used: the kernels change speed, not results.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels.cpp")
# The vector width ATen's `Vectorized` is compiled for, by what torch itself uses on this CPU
# (Sleef's exp and tanh come from libtorch). AVX-512 ran the GLU and most expert shapes 1.3-1.6x
# faster than AVX2 here. No OpenMP: the kernels run on the calling thread (see kernels.cpp).
CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
ENV_SWITCH = "K3SCALE_CPU_KERNELS"
MESSAGE_LINES = 12


@functools.cache
def _build() -> tuple[ModuleType | None, str | None]:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None, f"{ENV_SWITCH}=0"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in CAPABILITY_FLAGS:
        return None, f"the CPU lacks AVX2 (torch reports {capability})"
    flags = [
        "-O3",
        *CAPABILITY_FLAGS[capability],
        f"-DCPU_CAPABILITY={capability}",
        f"-DCPU_CAPABILITY_{capability}",
    ]
    try:
        from torch.utils.cpp_extension import load as load_extension

        # One build per instruction set, so a shared cache serves mixed machines.
        name = f"k3scale_cpu_kernels_{capability.lower()}"
        module = load_extension(name, [str(SOURCE)], extra_cflags=flags)
    except Exception as error:  # compiler missing, headers missing, build error
        # The compiler's full output can run to pages; its last lines carry the error.
        tail = "\n".join(str(error).strip().splitlines()[-MESSAGE_LINES:])
        reason = f"building {SOURCE.name} failed: {type(error).__name__}: {tail}"
        log.warning("fused CPU kernels off, torch paths used instead: %s", reason)
        return None, reason
    return module, None


def load() -> ModuleType | None:
    """The compiled kernels module, or None when they are off or could not be built."""
    return _build()[0]


def unavailable_reason() -> str | None:
    """Why `load()` returns None, or None when the kernels are available."""
    return _build()[1]


def status() -> str:
    """One line for setup logs: where the built kernels live, or why they are off."""
    module = load()
    return (
        f"fused CPU kernels: {module.__file__}"
        if module
        else f"fused CPU kernels off: {unavailable_reason()}"
    )
