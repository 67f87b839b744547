"""Build and load the fused CPU kernels with torch's extension builder (g++ and ninja), once per
machine and version of the sources.

Each op's C++ source sits in its folder beside its Python wrapper and torch reference
(`SOURCES`); they share `cpu/common.h`, declare their entry points in `cpu/ops.h`, and
`cpu/bindings.cpp` exposes them all in one extension. The first call compiles it into torch's
extension cache (`TORCH_EXTENSIONS_DIR`, default `~/.cache/torch_extensions`; about two minutes on
2 cores) under a file lock, so concurrent Ray workers build once; later processes only load the
cached library. `K3SCALE_CPU_KERNELS=0` turns the kernels off (callers fall back to the plain
torch paths). If the build fails, the reason is logged once and the torch paths are used: the
kernels change speed, not results.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

OPS_DIR = Path(__file__).parent.parent
# Object files are named after a source's file name, so the names must differ across folders.
SOURCES = tuple(
    OPS_DIR / name
    for name in (
        "attention/causal.cpp",
        "attnres/fused.cpp",
        "cpu/bindings.cpp",
        "cpu/conv.cpp",
        "head_ce/chunked.cpp",
        "kda/recurrent.cpp",
        "moe/experts.cpp",
        "moe/layer.cpp",
        "moe/router.cpp",
        "qb/histogram.cpp",
        "situ/glu.cpp",
    )
)
# The vector width ATen's `Vectorized` is compiled for, by what torch itself uses on this CPU
# (Sleef's exp and tanh come from libtorch). AVX-512 ran the GLU and most expert shapes 1.3-1.6x
# faster than AVX2 here. No OpenMP: the kernels run on the calling thread (see cpu/common.h).
CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
ENV_SWITCH = "K3SCALE_CPU_KERNELS"
MESSAGE_LINES = 12
DIGEST_CHARS = 12


def _extension_name(capability: str) -> str:
    """The extension's name: one per instruction set and per version of the sources and headers.

    torch's own versioning hashes only the listed sources, and only within one process; the
    digest in the name keeps builds of different sources (another checkout, a header edit) in
    separate cache folders.
    """
    digest = hashlib.sha256()
    for path in (*SOURCES, *sorted(OPS_DIR.glob("*/*.h"))):
        digest.update(path.relative_to(OPS_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return f"k3scale_cpu_kernels_{capability.lower()}_{digest.hexdigest()[:DIGEST_CHARS]}"


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

        # One build per instruction set and source version, so a shared cache serves mixed
        # machines and checkouts.
        name = _extension_name(capability)
        module = load_extension(name, [str(path) for path in SOURCES], extra_cflags=flags)
    except Exception as error:  # compiler missing, headers missing, build error
        # The compiler's full output can run to pages; its last lines carry the error.
        tail = "\n".join(str(error).strip().splitlines()[-MESSAGE_LINES:])
        reason = f"building the fused CPU kernels failed: {type(error).__name__}: {tail}"
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
