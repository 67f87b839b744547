"""Kernel backend selection: one function per op returns the callable for `model.backend`.

`"cpu"` (the default) is the fast CPU path: `"torch"` plus C++ kernels where they beat it at the
study ladders' shapes (today: KDA as its token recurrence, `kda/recurrent.py`; MLA also pads its
heads for torch's flash SDPA kernel, `models/mla.py`); it falls back to `"torch"` for other
devices and shapes. `"torch"` is the plain-torch reference path it is tested against (runs
anywhere; it too uses the fused C++ MoE, GLU and head kernels on CPU); `"triton"` the Triton kernels, which need
an NVIDIA GPU, or `TRITON_INTERPRET=1` (set before anything imports Triton) to run them on CPU in
tests. Both callables of an op share one signature, so a layer stores the returned function once
at construction and calls it like the torch version. The Triton modules are imported only when
asked for, so choosing `"torch"` never imports Triton.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Literal

from k3scale.errors import K3ScaleError

Backend = Literal["cpu", "torch", "triton"]
BACKENDS = ("cpu", "torch", "triton")


@functools.cache
def triton_unavailable_reason() -> str | None:
    """Why Triton kernels cannot run in this process, or None when they can (checked once)."""
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed (pip install 'k3scale[kernels]')"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    import torch

    if not torch.cuda.is_available() or torch.version.cuda is None:
        return "no NVIDIA GPU is visible (and TRITON_INTERPRET=1 is not set for CPU testing)"
    return None


def check_backend(backend: str, device_type: str | None = None) -> None:
    """Raise K3ScaleError unless `backend` is known and usable here (and on `device_type`).

    Args:
        backend: `"cpu"`, `"torch"` or `"triton"` (the config field `model.backend`).
        device_type: where the run's tensors live (`"cpu"` or `"cuda"`, the resolved
            `train.device`); None checks the backend alone, as a layer does when it is built.
    """
    if backend not in BACKENDS:
        raise K3ScaleError(f"model.backend: expected one of {BACKENDS}, got {backend!r}")
    if backend != "triton":
        return
    if (reason := triton_unavailable_reason()) is not None:
        raise K3ScaleError(
            f"model.backend=triton: {reason}; set model.backend=torch or run on an NVIDIA GPU"
        )
    # The compiled kernels take CUDA tensors only; the interpreter is what runs them on CPU.
    if device_type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise K3ScaleError(
            "model.backend=triton runs on CUDA tensors but train.device resolves to cpu: set "
            "train.device=cuda (or auto), or model.backend=torch"
        )


def kda_op(backend: Backend) -> Callable:
    """Chunked KDA `(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)`."""
    check_backend(backend)
    if backend == "triton":
        from k3scale.ops.kda.triton import chunk_kda_triton

        return chunk_kda_triton
    if backend == "cpu":
        from k3scale.ops.kda.recurrent import kda_cpu

        return kda_cpu
    from k3scale.ops.kda.chunk import chunk_kda

    return chunk_kda


def situ_glu_op(backend: Backend) -> Callable:
    """SiTU-GLU `(gate, up, beta=4.0, linear_beta=25.0) -> h`."""
    check_backend(backend)
    if backend == "triton":
        from k3scale.ops.situ.triton import situ_glu_triton

        return situ_glu_triton
    from k3scale.ops.situ.naive import situ_glu

    return situ_glu


def qb_counts_op(backend: Backend) -> Callable:
    """QB margin counts `(scores, cutoff, cutoff_expert, bias, num_bins) -> [n, 1 + R]` int64."""
    check_backend(backend)
    if backend == "triton":
        from k3scale.ops.qb.triton import margin_counts_triton

        return margin_counts_triton
    from k3scale.ops.qb.histogram import margin_counts

    return margin_counts
