"""Build and load the fused CPU kernels: one extension per instruction set and source version,
built ahead of time by `scripts/setup.sh` and loaded at run time without any lock.

Each op's C++ source sits in its folder beside its Python wrapper and torch reference
(`SOURCES`); they share `cpu/common.h`, declare their entry points in `cpu/ops.h`, and
`cpu/bindings.cpp` exposes them all in one Python module.

Why not `torch.utils.cpp_extension.load`: every process that called it took a lock file in the
build folder, also to load a finished build, and waited forever while the file existed, so one
process killed while holding it wedged every later one (issue 35). Here a build compiles into a
private folder and publishes the library with one atomic rename; a process that finds the library
imports it, and one that does not builds it itself. Two concurrent builders waste a build, never
wait on each other, and a killed builder leaves only its private folder, removed by a later build.

The library lives in `kernel_dir()` (`TORCH_EXTENSIONS_DIR/k3scale`, default
`~/.cache/torch_extensions/k3scale`). `K3SCALE_CPU_KERNELS=0` turns the kernels off and
`ATEN_CPU_CAPABILITY=avx2` makes torch, and so this build, use AVX2 on an AVX-512 CPU. If the
build fails, the reason is logged once and the torch paths are used: the kernels change speed,
not results.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import torch

from k3scale.ops.kernel_path import KernelPath

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
# These are every x86-64 capability torch reports besides DEFAULT (no AVX2: the torch paths run).
CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
ENV_SWITCH = "K3SCALE_CPU_KERNELS"
MESSAGE_LINES = 12
DIGEST_CHARS = 12
# What the torch paths cost: in bench train's committed run (analysis/results/bench/train.json)
# the fused path's training step was 2.16-3.85x quicker than the reference path's at the study
# rungs (k2/k3 s1-s3), and the reference path still used the fused MoE, GLU and cross-entropy
# kernels, so a process without any kernel is slower still. A test holds this to the JSON.
FUSED_SPEEDUP_RANGE = (2.2, 3.9)
# A private build folder older than this belongs to a builder that died (a build takes minutes).
STALE_BUILD_S = 3600.0
BUILD_PREFIX = ".build-"


def kernel_dir() -> Path:
    """Where built kernel libraries live (one file per capability and source version)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    return Path(root) / "k3scale"


def extension_name(capability: str) -> str:
    """The extension's name: one per instruction set and per version of the sources and headers,
    so a shared cache serves mixed machines and checkouts."""
    digest = hashlib.sha256(torch.__version__.encode())
    for path in (*SOURCES, *sorted(OPS_DIR.glob("*/*.h"))):
        digest.update(path.relative_to(OPS_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return f"k3scale_cpu_kernels_{capability.lower()}_{digest.hexdigest()[:DIGEST_CHARS]}"


def compile_command(source: Path, capability: str, name: str) -> list[str]:
    """The compiler call for one source at `capability`, without its output option (`-c -o F`
    builds; `-fsyntax-only` checks, on any host: compiling needs no such CPU)."""
    from torch.utils.cpp_extension import include_paths

    includes = [*include_paths("cpu"), sysconfig.get_path("include", scheme="posix_prefix")]
    return [
        os.environ.get("CXX", "c++"),
        f"-DTORCH_EXTENSION_NAME={name}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *(arg for include in includes for arg in ("-isystem", include)),
        "-fPIC",
        "-std=c++20",
        "-O3",
        *CAPABILITY_FLAGS[capability],
        f"-DCPU_CAPABILITY={capability}",
        f"-DCPU_CAPABILITY_{capability}",
        str(source),
    ]


def _link_command(objects: list[Path], output: Path) -> list[str]:
    from torch.utils.cpp_extension import library_paths

    libraries = [f"-L{path}" for path in library_paths("cpu")]
    torch_libs = ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    return [os.environ.get("CXX", "c++"), "-shared", *map(str, objects), *libraries, *torch_libs,
            "-o", str(output)]  # fmt: skip


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:1])} exited {done.returncode}:\n{done.stderr}")


def build_extension(capability: str, root: Path | None = None) -> Path:
    """Compile and link the extension for `capability` into `root` (default `kernel_dir()`) and
    return the library's path; a library already there is returned as it is.

    Lock-free: the build happens in a private folder and the library is published with an atomic
    rename, so a reader sees no library or a whole one.
    """
    root = root or kernel_dir()
    name = extension_name(capability)
    library = root / f"{name}.so"
    if library.exists():
        return library
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(root)
    private = Path(tempfile.mkdtemp(prefix=f"{BUILD_PREFIX}{socket.gethostname()}-{os.getpid()}-",
                                    dir=root))  # fmt: skip
    try:
        objects = [private / f"{source.stem}.o" for source in SOURCES]
        commands = [
            [*compile_command(source, capability, name), "-c", "-o", str(obj)]
            for source, obj in zip(SOURCES, objects, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(_run, commands))
        _run(_link_command(objects, private / library.name))
        os.replace(private / library.name, library)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return library


def _remove_stale_builds(root: Path) -> None:
    now = time.time()
    for folder in root.glob(f"{BUILD_PREFIX}*"):
        try:
            if now - folder.stat().st_mtime > STALE_BUILD_S:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # another builder removed it first
            pass


def _import(library: Path) -> ModuleType:
    name = library.name.removesuffix(".so")
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _load() -> tuple[ModuleType | None, KernelPath]:
    capability = torch.backends.cpu.get_cpu_capability()
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None, KernelPath("torch", capability, f"{ENV_SWITCH}=0")
    if capability not in CAPABILITY_FLAGS:
        return None, KernelPath(
            "torch", capability, f"the CPU lacks AVX2 (torch reports {capability})"
        )
    try:
        module = _import(build_extension(capability))
    except Exception as error:  # compiler missing, headers missing, build error
        # The compiler's full output can run to pages; its last lines carry the error.
        tail = "\n".join(str(error).strip().splitlines()[-MESSAGE_LINES:])
        reason = f"building the fused CPU kernels failed: {type(error).__name__}: {tail}"
        log.warning("fused CPU kernels off, torch paths used instead: %s", reason)
        return None, KernelPath("torch", capability, reason)
    return module, KernelPath("fused", capability)


def load() -> ModuleType | None:
    """The compiled kernels module, or None when they are off or could not be built."""
    return _load()[0]


def kernel_path() -> KernelPath:
    """Which path this process's CPU ops take, and why."""
    return _load()[1]


def unavailable_reason() -> str | None:
    """Why `load()` returns None, or None when the kernels are available."""
    return kernel_path().reason


def slow_path_notice() -> str | None:
    """One line for `train` and `study run` when the fused kernels are off: that, why, and what
    it costs; None on the fused path."""
    path = kernel_path()
    if path.name == "fused":
        return None
    low, high = FUSED_SPEEDUP_RANGE
    reason = (path.reason or "").splitlines()[0]
    return (
        f"SLOW PATH: fused CPU kernels off ({reason}); CPU training steps take {low}-{high}x as "
        "long or more (bench train at the study rungs). README: 'Which CPUs get the fused kernels'"
    )


def status() -> str:
    """One line for setup logs: where the built kernels live, or why they are off."""
    module = load()
    return f"fused CPU kernels: {module.__file__}" if module else kernel_path().describe()
