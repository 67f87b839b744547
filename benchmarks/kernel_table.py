"""Ahead-of-time resource table of Triton kernels for a GPU this machine does not have.

Each op is run once on CPU tensors with Triton's launch replaced by a recorder, so every kernel is
seen with the exact arguments, constexprs, grid and launch options its Python wrapper chooses
(fla's autotuned kernels with their first surviving config: fla picks by timing on the GPU).
Each recorded launch is then compiled for `sm_<arch>` with Triton's own argument specialization,
and `cuobjdump -res-usage` gives registers and spill stack per thread.

FLOPs and bytes per call are counted, not modelled: `count_work` runs the same ops under the
Triton interpreter (`TRITON_INTERPRET=1`, a subprocess) at two short lengths and counts every
`tl.dot` (2 M N K, batched dims included) and every unmasked element loaded or stored (element
size of the pointer), per kernel. Per-program work is linear in T for these kernels (chunks in
parallel or in a loop), so the counts are extrapolated linearly to the requested T and scaled by
B*H from a B = H = 1 run. Element-wise FLOPs (exp, scaling) are not counted; bytes count every
load, cached or not, so they bound DRAM traffic from above.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
import torch.nn.functional as F

# H100/H200 per-thread register file share and shared memory per block.
MAX_REGISTERS = 255
SHARED_LIMIT_BYTES = 227 * 1024
# Realistic sizes of the table (gpu_check's KDA timing shapes).
BATCH, SEQ_LEN, HEADS = 4, 4096, 16
COUNT_LENGTHS = (128, 256)  # interpreter runs for the FLOP/byte extrapolation


@dataclass
class Launch:
    """One recorded kernel launch."""

    name: str
    kernel: object  # triton JITFunction
    grid: tuple
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def recorded_launches():
    """Record launches instead of running them; autotuners keep only their first config."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []
    real_run, real_prune = JITFunction.run, Autotuner.prune_configs

    def record(self, *args, grid, warmup, **kwargs):
        launches.append(Launch(self.__name__, self, grid, args, kwargs))

    JITFunction.run = record
    Autotuner.prune_configs = lambda self, kwargs: real_prune(self, kwargs)[:1]
    try:
        yield launches
    finally:
        JITFunction.run, Autotuner.prune_configs = real_run, real_prune


def kda_inputs(d_head: int, dtype: torch.dtype, seq_len: int, batch=1, heads=1, device="cpu"):
    """q, k, v, g, beta with K = V = d_head, K3's bounded gate at init, all requiring grads."""
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (batch, seq_len, heads, d_head)
    q = F.normalize(torch.randn(*shape, device=device, generator=gen), dim=-1)
    k = F.normalize(torch.randn(*shape, device=device, generator=gen), dim=-1)
    v = torch.randn(*shape, device=device, generator=gen)
    g = -5.0 * torch.sigmoid(torch.randn(*shape, device=device, generator=gen) - 4.0)
    beta = torch.sigmoid(torch.randn(batch, seq_len, heads, device=device, generator=gen))
    return [x.to(dtype).requires_grad_() for x in (q, k, v, g, beta)]


def kda_ops(chunk: int = 64) -> dict[str, Callable]:
    """impl name -> chunk_kda-like function (fla only where it imports; its chunk is 64)."""
    from k3scale.ops.kda.triton import chunk_kda_triton

    ops = {"k3scale": functools.partial(chunk_kda_triton, chunk_size=chunk)}
    with contextlib.suppress(Exception):
        from fla.ops.kda import chunk_kda

        ops["fla"] = chunk_kda
    return ops


def forward_backward(op: Callable, inputs: list[torch.Tensor]) -> None:
    o, _ = op(*inputs, output_final_state=True)
    torch.autograd.grad(o, inputs, torch.ones_like(o), allow_unused=True)


def launches_of(op: Callable, d_head: int, dtype: torch.dtype) -> tuple[list[Launch], str]:
    """Launches of one forward + backward at T = SEQ_LEN (B = 1, H = 2), or ([], why not)."""
    with recorded_launches() as launches:
        try:
            forward_backward(op, kda_inputs(d_head, dtype, SEQ_LEN, heads=2))
        except Exception as exc:  # recorded so far still compiled; the reason is reported
            return launches, f"stopped after {len(launches)} launches: {type(exc).__name__}: {exc}"
    return launches, ""


def compile_launch(launch: Launch, arch: int, tmp: Path) -> dict:
    """Registers, spill stack bytes and shared memory of one launch compiled for sm_<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = launch.kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(launch.kwargs, debug=False)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound, specialization, options
    )
    source = ASTSource(kernel, signature, constexprs, attrs)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    cubin = tmp / f"{launch.name}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True).stdout
    found = dict(re.findall(r"(REG|STACK):(\d+)", usage))
    return dict(
        registers=int(found["REG"]), spill_bytes=int(found["STACK"]),
        shared_bytes=compiled.metadata.shared, num_warps=options.num_warps,
        num_stages=options.num_stages,
    )  # fmt: skip


def grid_size(launch: Launch) -> int:
    grid = launch.grid
    if callable(grid):
        names = launch.kernel.arg_names
        grid = grid(dict(zip(names, launch.args), **launch.kwargs))
    size = 1
    for dim in grid:
        size *= int(dim)
    return size


def count_work(d_head: int, dtype: str, impls: list[str], chunk: int = 64) -> dict:
    """{impl: {kernel: {"flops", "bytes", "calls"}}} at the table's sizes, from interpreter counts
    in a subprocess (TRITON_INTERPRET must be set before Triton is imported)."""
    command = [sys.executable, __file__, "--count", str(d_head), dtype, str(chunk), *impls]
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "no output")
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def counting(totals: dict):
    """Count dot FLOPs and loaded/stored bytes per running interpreted kernel into `totals`."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    real = builder.create_dot, builder.create_masked_load, builder.create_masked_store
    real_run = interpreter.InterpretedFunction.run
    current = {"name": None}

    def add(key, amount):
        entry = totals.setdefault(current["name"], {"flops": 0, "bytes": 0, "calls": 0})
        entry[key] += int(amount)

    def dot(self, a, b, d, *rest):
        *batch, m, k = a.data.shape
        add("flops", 2 * m * k * b.data.shape[-1] * int(np.prod(batch or [1])))
        return real[0](self, a, b, d, *rest)

    def load(self, ptrs, mask, other, *rest):
        add("bytes", np.count_nonzero(mask.data) * ptrs.get_element_ty().primitive_bitwidth // 8)
        return real[1](self, ptrs, mask, other, *rest)

    def store(self, ptrs, value, mask, *rest):
        add("bytes", np.count_nonzero(mask.data) * ptrs.get_element_ty().primitive_bitwidth // 8)
        return real[2](self, ptrs, value, mask, *rest)

    def run(self, *args, grid, warmup, **kwargs):
        current["name"] = self.__name__
        add("calls", 1)
        try:
            return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        except Exception as exc:  # e.g. a construct the interpreter lacks: skip, keep counting
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            totals[self.__name__]["error"] = f"not countable under the interpreter: {message[:100]}"

    builder.create_dot, builder.create_masked_load, builder.create_masked_store = dot, load, store
    interpreter.InterpretedFunction.run = run
    try:
        yield
    finally:
        builder.create_dot, builder.create_masked_load, builder.create_masked_store = real
        interpreter.InterpretedFunction.run = real_run


def count_main(d_head: int, dtype_name: str, chunk: int, impls: list[str]) -> None:
    """Subprocess side of count_work: print one JSON line."""
    from triton.runtime.autotuner import Autotuner

    real_prune = Autotuner.prune_configs
    Autotuner.prune_configs = lambda self, kwargs: real_prune(self, kwargs)[:1]
    ops = kda_ops(chunk)
    dtype = getattr(torch, dtype_name)
    result = {}
    for impl in impls:
        runs = []
        for seq_len in COUNT_LENGTHS:
            totals: dict = {}
            with counting(totals):
                forward_backward(ops[impl], kda_inputs(d_head, dtype, seq_len))
            runs.append(totals)
        (t1, t2), scale = COUNT_LENGTHS, BATCH * HEADS
        result[impl] = {
            name: {
                key: scale * (a[key] + (b[key] - a[key]) * (SEQ_LEN - t1) / (t2 - t1))
                if key in ("flops", "bytes") else a[key]
                for key in a
            }
            for name, a in runs[0].items()
            if (b := runs[1].get(name)) is not None
        }  # fmt: skip
    print(json.dumps(result))


@dataclass
class TableRow:
    impl: str
    kernel: str
    d_head: int
    dtype: str
    registers: int | None = None
    spill_bytes: int | None = None
    shared_bytes: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    programs: int | None = None
    calls: int | None = None
    gflop: float | None = None
    mbytes: float | None = None
    note: str = ""

    @property
    def fits(self) -> bool:
        """Compiled, no spills, registers and shared memory within an H100's limits."""
        return (
            self.registers is not None and self.spill_bytes == 0
            and self.registers <= MAX_REGISTERS and self.shared_bytes <= SHARED_LIMIT_BYTES
        )  # fmt: skip


def build_table(
    arch: int, impls: list[str], d_heads=(64, 128), dtypes=("bfloat16", "float32"), work=True,
    chunk: int = 64,
) -> list[TableRow]:  # fmt: skip
    ops = kda_ops(chunk)
    rows = []
    with TemporaryDirectory() as tmp:
        for impl in impls:
            for d_head in d_heads:
                for dtype in dtypes:
                    if impl not in ops:
                        rows.append(TableRow(impl, "-", d_head, dtype, note="not importable"))
                        continue
                    rows.extend(
                        impl_rows(impl, ops[impl], d_head, dtype, arch, Path(tmp), work, chunk)
                    )
    return rows


def impl_rows(impl, op, d_head, dtype, arch, tmp: Path, work: bool, chunk: int) -> list[TableRow]:
    launches, why = launches_of(op, d_head, getattr(torch, dtype))
    counts, count_note = {}, ""
    if work:
        try:
            counts = count_work(d_head, dtype, [impl], chunk)[impl]
        except Exception as exc:
            count_note = f"no FLOP/byte count: {type(exc).__name__}: {exc}"
    rows, seen = [], set()
    for launch in launches:
        if launch.name in seen:  # e.g. fla's state kernel in forward and in backward
            continue
        seen.add(launch.name)
        row = TableRow(impl, launch.name, d_head, dtype, note=count_note)
        try:
            for key, value in compile_launch(launch, arch, tmp).items():
                setattr(row, key, value)
        except Exception as exc:
            row.note = f"not compiled: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        with contextlib.suppress(Exception):
            row.programs = grid_size(launch) * BATCH * HEADS // 2  # recorded at B=1, H=2
        entry = counts.get(launch.name, {})
        if "error" in entry:
            row.note = (row.note + "; " if row.note else "") + entry["error"]
        elif entry:
            row.gflop, row.mbytes = entry["flops"] / 1e9, entry["bytes"] / 1e6
        row.calls = entry.get("calls")
        rows.append(row)
    if why:
        rows.append(TableRow(impl, "-", d_head, dtype, note=why))
    return rows


def other_k3scale_rows(arch: int) -> list[TableRow]:
    """SiTU-GLU (bf16, 4096-wide rows) and QB counts (64 experts, 256 bins), fwd and bwd."""
    from k3scale.ops.qb.naive import route_with_cutoff
    from k3scale.ops.qb.triton import margin_counts_triton
    from k3scale.ops.situ.triton import situ_glu_triton

    def situ():
        fused = torch.randn(8, 2 * 4096, dtype=torch.bfloat16, requires_grad=True)
        h = situ_glu_triton(fused[:, :4096], fused[:, 4096:])
        torch.autograd.grad(h, fused, torch.ones_like(h))

    def qb():
        scores = torch.sigmoid(torch.randn(1024, 64))
        bias = torch.zeros(64)
        _, cutoff = route_with_cutoff(scores, bias, 8)
        cutoff_expert = torch.topk(scores + bias, 9, dim=-1).indices[:, 8]
        margin_counts_triton(scores, cutoff, cutoff_expert, bias, 256)

    rows = []
    with TemporaryDirectory() as tmp:
        for run in (situ, qb):
            with recorded_launches() as launches:
                run()
            for launch in launches:
                row = TableRow("k3scale", launch.name, 0, "-")
                for key, value in compile_launch(launch, arch, Path(tmp)).items():
                    setattr(row, key, value)
                rows.append(row)
    return rows


def print_table(rows: list[TableRow]) -> None:
    print(f"sizes: B={BATCH} T={SEQ_LEN} H={HEADS}, K = V = d_head; GFLOP (tl.dot only) and MB "
          "moved: totals over the kernel's calls in one forward + backward, counted under the "
          "interpreter (benchmarks/README.md); fla kernels with their first autotune "
          "config")  # fmt: skip
    print(f"{'impl':8} {'kernel':42} {'d':>3} {'dtype':8} {'regs':>4} {'spill':>5} "
          f"{'smem KiB':>8} {'warps':>5} {'calls':>5} {'GFLOP':>8} {'MB':>8}  note")  # fmt: skip

    def show(value, fmt):
        return format(value, fmt) if value is not None else "-"

    for r in rows:
        status = "" if r.fits or r.registers is None else "  SPILLS/OVER LIMIT"
        shared = r.shared_bytes / 1024 if r.shared_bytes is not None else None
        print(f"{r.impl:8} {r.kernel[:42]:42} {r.d_head:3} {r.dtype:8} "
              f"{show(r.registers, '4d'):>4} {show(r.spill_bytes, '5d'):>5} "
              f"{show(shared, '8.1f'):>8} {show(r.num_warps, '5d'):>5} {show(r.calls, '5d'):>5} "
              f"{show(r.gflop, '8.2f'):>8} {show(r.mbytes, '8.0f'):>8}  "
              f"{r.note}{status}")  # fmt: skip


if __name__ == "__main__" and sys.argv[1:2] == ["--count"]:
    count_main(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5:])
