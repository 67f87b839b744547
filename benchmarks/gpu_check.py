"""GPU check of the Triton kernels: correctness against references, then times side by side.

Run with `bash benchmarks/gpu_check.sh` on a machine with an NVIDIA GPU. For each op it checks the
Triton kernel against its reference at realistic sizes and prints one table: median time, speed
ratio vs the torch path (and vs fla's `chunk_kda` when fla is installed), and the achieved fraction
of a peak measured in the same run: memory bandwidth of a large device copy (SiTU, QB) or the bf16
matmul rate (KDA; FLOPs counted for the chunked algorithm's matmuls). The same results go to one
JSON file (`--json`, default gpu_check.json; schema in benchmarks/README.md). Exit codes: 0 all
checks pass, 1 a check failed (its row says why), 2 no usable GPU (one line on stderr, nothing
run, no JSON written).
`--compile-only` needs no GPU: it compiles every k3scale kernel and fla's `chunk_kda` kernels for
sm_90 (or `--arch`) at the realistic sizes (`benchmarks/kernel_table.py`) and prints registers,
spill bytes, shared memory and counted FLOPs and bytes per call; exit 1 if a k3scale kernel
spills or exceeds an H100's limits.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Relative RMS tolerances. Kernel vs reference on identical bf16 inputs: the bf16 output rounding
# (8 mantissa bits, ~3e-3 RMS) dominates. fp32 KDA at the small size: the kernels' matmuls run
# as TF32 (10-bit mantissa operands, ~1e-3 relative; DOT_PRECISION in k3scale/ops/kda/triton.py).
TOL_BF16 = 2e-2
TOL_FP32 = 5e-3


@dataclass(frozen=True)
class Row:
    """One line of the report."""

    op: str
    path: str
    ms: float | None
    vs_torch: float | None = None
    achieved: str = ""
    fraction: float | None = None
    error: float | None = None
    ok: bool = True
    note: str = ""


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the check, or None."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set (the interpreter would run instead of the GPU); unset it"
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return "no NVIDIA GPU visible (torch.cuda.is_available() is False or not a CUDA build)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed (pip install 'k3scale[kernels]')"
    return None


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    diff = (actual.double() - expected.double()).pow(2).mean().sqrt()
    return (diff / expected.double().pow(2).mean().sqrt().clamp_min(1e-30)).item()


def median_ms(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    """Median wall time of `fn` on the GPU in milliseconds (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_peaks(reps: int) -> tuple[float, float]:
    """(bf16 matmul TFLOP/s, device copy GB/s counting read + write) measured here."""
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    tflops = 2 * n**3 / median_ms(lambda: a @ b, reps) / 1e9
    src = torch.empty(2**28, device="cuda", dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    gbps = 2 * src.numel() * 4 / median_ms(lambda: dst.copy_(src), reps) / 1e6
    return tflops, gbps


def fwd_bwd(fn: Callable, inputs: list[torch.Tensor], cotangent: torch.Tensor) -> Callable:
    def run():
        out = fn(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        return torch.autograd.grad(out, inputs, cotangent)

    return run


def check_situ(numel: int, reps: int, gbps: float) -> list[Row]:
    from k3scale.ops.situ.naive import situ_glu
    from k3scale.ops.situ.triton import situ_glu_triton

    width = 4096
    fused = torch.randn(numel // width, 2 * width, device="cuda", dtype=torch.bfloat16) * 3
    fused.requires_grad_()
    gate, up = fused[:, :width], fused[:, width:]
    d_h = torch.randn(numel // width, width, device="cuda", dtype=torch.bfloat16)
    (grad,) = fwd_bwd(lambda x: situ_glu_triton(x[:, :width], x[:, width:]), [fused], d_h)()
    ref = fused.detach().double().requires_grad_()
    h_ref = situ_glu(ref[:, :width], ref[:, width:])
    (grad_ref,) = torch.autograd.grad(h_ref, ref, d_h.double())
    with torch.no_grad():
        error = max(rel_rms(situ_glu_triton(gate, up), h_ref), rel_rms(grad, grad_ref))

    def forward(fn):
        return torch.no_grad()(lambda: fn(gate, up))

    def forward_backward(fn):
        return fwd_bwd(lambda x: fn(x[:, :width], x[:, width:]), [fused], d_h)

    rows = []
    # Bytes moved (bf16): forward reads gate, up and writes h; backward reads 3 and writes 2.
    for label, bytes_moved, make in (
        ("fwd", 3 * 2 * numel, forward),
        ("fwd+bwd", (3 + 5) * 2 * numel, forward_backward),
    ):
        torch_ms = median_ms(make(situ_glu), reps)
        triton_ms = median_ms(make(situ_glu_triton), reps)
        rate = bytes_moved / triton_ms / 1e6
        rows.append(Row(f"situ_glu {label}", "torch", torch_ms))
        rows.append(Row(f"situ_glu {label}", "triton", triton_ms, torch_ms / triton_ms,
                        f"{rate:.0f} GB/s", rate / gbps, error, error < TOL_BF16))  # fmt: skip
    return rows


def check_qb(num_tokens: int, num_experts: int, num_bins: int, reps: int, gbps: float) -> list[Row]:
    from k3scale.ops.qb.histogram import margin_counts
    from k3scale.ops.qb.naive import route_with_cutoff
    from k3scale.ops.qb.triton import margin_counts_triton

    scores = torch.sigmoid(torch.randn(num_tokens, num_experts, device="cuda"))
    bias = 0.1 * torch.randn(num_experts, device="cuda")
    _, cutoff = route_with_cutoff(scores, bias, 8)
    cutoff_expert = torch.topk(scores + bias, 9, dim=-1).indices[:, 8]
    args = (scores, cutoff, cutoff_expert, bias, num_bins)
    same = torch.equal(margin_counts_triton(*args), margin_counts(*args))
    torch_ms = median_ms(lambda: margin_counts(*args), reps)
    triton_ms = median_ms(lambda: margin_counts_triton(*args), reps)
    rate = (scores.numel() * 4 + num_tokens * 16) / triton_ms / 1e6  # scores + cutoff + expert
    return [
        Row("qb_counts", "torch", torch_ms),
        Row("qb_counts", "triton", triton_ms, torch_ms / triton_ms, f"{rate:.0f} GB/s",
            rate / gbps, 0.0 if same else 1.0, same, "" if same else "counts differ"),
    ]  # fmt: skip


def kda_inputs(batch, seq_len, heads, d_head, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, seq_len, heads, d_head)
    q = F.normalize(torch.randn(*shape, device="cuda", generator=gen), dim=-1)
    k = F.normalize(torch.randn(*shape, device="cuda", generator=gen), dim=-1)
    v = torch.randn(*shape, device="cuda", generator=gen)
    # K3 bounded gate at its init statistics (architecture.md 1.2): g = -5 sigmoid(z + b_dt).
    g = -5.0 * torch.sigmoid(torch.randn(*shape, device="cuda", generator=gen) - 4.0)
    beta = torch.sigmoid(torch.randn(batch, seq_len, heads, device="cuda", generator=gen))
    return [x.to(dtype).requires_grad_() for x in (q, k, v, g, beta)]


def kda_flops(batch, seq_len, heads, d_key, d_value, chunk) -> float:
    """Forward matmul FLOPs of the chunked algorithm (A_kk, A_qk, X, W, U, outputs, states)."""
    per_chunk = (
        2 * 2 * chunk**2 * d_key  # A_kk, A_qk
        + chunk**3 / 3  # forward substitution
        + 2 * chunk**2 * (d_key + d_value)  # W, U
        + 2 * chunk * d_key * d_value * 3  # W S, Q_g S, K_d^T V_e
        + 2 * chunk**2 * d_value  # A_qk V_e
    )
    return per_chunk * batch * heads * (seq_len // chunk)


def check_kda_small() -> list[Row]:
    """fp32 kernel vs the step-by-step reference (fp64) at a small odd size, with all grads."""
    from k3scale.ops.kda.naive import naive_recurrent_kda
    from k3scale.ops.kda.triton import chunk_kda_triton

    inputs = kda_inputs(2, 100, 3, 64, torch.float32, seed=1)
    d_o = torch.randn_like(inputs[2])
    actual = fwd_bwd(chunk_kda_triton, inputs, d_o)()
    reference = [x.detach().double().requires_grad_() for x in inputs]
    expected = fwd_bwd(naive_recurrent_kda, reference, d_o.double())()
    error = max(rel_rms(a, e) for a, e in zip(actual, expected))
    return [Row("kda T=100 fp32 grads", "triton", None, error=error, ok=error < TOL_FP32)]


def check_kda(batch, seq_len, heads, d_head, reps: int, tflops: float) -> list[Row]:
    from k3scale.ops.kda.chunk import chunk_kda
    from k3scale.ops.kda.triton import chunk_kda_triton

    # Triton at the default chunk 64 and at 16 (smaller pairwise register tiles, more steps).
    paths = {
        "torch": chunk_kda,
        "triton": chunk_kda_triton,
        "triton16": functools.partial(chunk_kda_triton, chunk_size=16),
    }
    inputs = kda_inputs(batch, seq_len, heads, d_head, torch.bfloat16)
    d_o = torch.randn_like(inputs[2])
    results = {name: fwd_bwd(fn, inputs, d_o)() for name, fn in paths.items()}
    rows = []
    try:  # fla is optional: a comparison, not a check of ours
        from fla.ops.kda import chunk_kda as fla_chunk_kda

        results["fla"] = fwd_bwd(fla_chunk_kda, inputs, d_o)()
        paths["fla"] = fla_chunk_kda
    except Exception as exc:
        rows.append(Row("kda", "fla", None, note=f"skipped: {type(exc).__name__}: {exc}"))
    flops = {name: kda_flops(batch, seq_len, heads, d_head, d_head, 64) for name in paths}
    flops["triton16"] = kda_flops(batch, seq_len, heads, d_head, d_head, 16)
    for label, factor in (("fwd", 1), ("fwd+bwd", 3)):  # backward ~ 2x forward
        times = {}
        for name, fn in paths.items():
            run = (lambda f=fn: f(*inputs)) if label == "fwd" else fwd_bwd(fn, inputs, d_o)
            with torch.no_grad() if label == "fwd" else torch.enable_grad():
                times[name] = median_ms(run, reps)
        for name, ms in times.items():
            error = max(rel_rms(a, e) for a, e in zip(results[name], results["torch"]))
            rate = factor * flops[name] / ms / 1e9
            rows.append(Row(f"kda {label}", name, ms, times["torch"] / ms, f"{rate:.1f} TFLOP/s",
                            rate / tflops, error, error < TOL_BF16))  # fmt: skip
    return rows


def print_table(rows: list[Row], tflops: float, gbps: float) -> None:
    print(f"measured peaks: bf16 matmul {tflops:.0f} TFLOP/s, device copy {gbps:.0f} GB/s")
    header = f"{'op':24} {'path':8} {'ms':>9} {'x torch':>8} {'achieved':>14} {'of peak':>8}"
    print(header + f" {'rel err':>9} check")
    for r in rows:
        ms = f"{r.ms:9.3f}" if r.ms is not None else f"{'-':>9}"
        ratio = f"{r.vs_torch:8.2f}" if r.vs_torch is not None else f"{'':>8}"
        frac = f"{r.fraction:8.1%}" if r.fraction is not None else f"{'':>8}"
        err = f"{r.error:9.1e}" if r.error is not None else f"{'':>9}"
        status = ("ok" if r.ok else "FAIL") + (f" {r.note}" if r.note else "")
        print(f"{r.op:24} {r.path:8} {ms} {ratio} {r.achieved:>14} {frac} {err} {status}")


def compile_only(arch: int, impls: list[str], count: bool, chunk: int) -> int:
    """Resource table of every kernel compiled for sm_<arch> (no GPU); 1 if a k3scale kernel
    spills, exceeds 255 registers or 227 KiB shared memory, or does not compile."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kernel_table

    rows = kernel_table.other_k3scale_rows(arch) if "k3scale" in impls else []
    rows += kernel_table.build_table(arch, impls, work=count, chunk=chunk)
    kernel_table.print_table(rows)
    ours = [r for r in rows if r.impl == "k3scale"]
    return 0 if all(r.fits for r in ours) else 1


def write_json(path: str, device: str, tflops: float, gbps: float, rows: list[Row], code: int):
    """One JSON object (schema in benchmarks/README.md), written by rename."""
    result = {
        "schema": 1, "device": device, "exit_code": code,
        "peaks": {"bf16_matmul_tflops": tflops, "device_copy_gbps": gbps},
        "rows": [dataclasses.asdict(r) for r in rows],
    }  # fmt: skip
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    parser.add_argument(
        "--compile-only", action="store_true",
        help="no GPU needed: compile the kernels for sm_<arch> and print their resources",
    )  # fmt: skip
    parser.add_argument("--arch", type=int, default=90, help="CUDA arch for --compile-only")
    parser.add_argument("--chunk", type=int, default=64, help="k3scale KDA chunk, --compile-only")
    parser.add_argument(
        "--impl", default="k3scale,fla", help="--compile-only: comma-separated k3scale, fla"
    )
    parser.add_argument(
        "--no-count", action="store_true", help="--compile-only: skip the FLOP/byte counts"
    )
    parser.add_argument("--json", default="gpu_check.json", help="where the GPU run writes JSON")
    args = parser.parse_args(argv)
    if args.compile_only:
        return compile_only(args.arch, args.impl.split(","), not args.no_count, args.chunk)
    if (reason := no_gpu_reason()) is not None:
        print(f"gpu_check: {reason}; nothing was checked.", file=sys.stderr)
        return 2
    reps = 5 if args.quick else 20
    seq_len, situ_numel, tokens = (1024, 2**22, 2**18) if args.quick else (4096, 2**24, 2**20)
    print(f"device: {torch.cuda.get_device_name()}")
    tflops, gbps = measure_peaks(reps)
    checks = {
        "situ_glu": lambda: check_situ(situ_numel, reps, gbps),
        "qb_counts": lambda: check_qb(tokens, 64, 256, reps, gbps),
        "kda small": check_kda_small,
        "kda": lambda: check_kda(4, seq_len, 16, 128, reps, tflops),
    }
    rows = []
    for name, check in checks.items():
        try:
            rows.extend(check())
        except Exception as exc:  # one broken kernel must not hide the others' results
            traceback.print_exc()
            rows.append(Row(name, "triton", None, ok=False, note=f"{type(exc).__name__}: {exc}"))
        torch.cuda.empty_cache()
    print_table(rows, tflops, gbps)
    code = 0 if all(r.ok for r in rows) else 1
    write_json(args.json, torch.cuda.get_device_name(), tflops, gbps, rows, code)
    print(f"wrote {args.json}")
    return code


if __name__ == "__main__":
    sys.exit(main())
