"""GPU check of the Triton kernels: correctness against references, then times side by side.

Run with `bash benchmarks/gpu_check.sh` on a machine with an NVIDIA GPU. For each op it checks the
Triton kernel against its reference at realistic sizes and prints one table: median time, speed
ratio vs the torch path (and vs fla's `chunk_kda` when fla is installed), and the achieved fraction
of a peak measured in the same run: memory bandwidth of a large device copy (SiTU, QB) or the bf16
matmul rate (KDA; FLOPs counted for the chunked algorithm's matmuls). Then it trains: 50 steps
of a K3 model under bf16 autocast on the Triton backend against the same run on the torch
backend, and the first trial of a study's `gpu` preset for about two minutes (tokens/s, MFU).
The same results go to one JSON file (`--json`, default gpu_check.json; schema in
benchmarks/README.md). Exit codes: 0 all checks pass, 1 a check failed (its row says why), 2 no
usable GPU (one line on stderr, nothing run, no JSON written).
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
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]

# Relative RMS tolerances. Kernel vs reference on identical bf16 inputs: the bf16 output rounding
# (8 mantissa bits, ~3e-3 RMS) dominates. fp32 KDA at the small size: the kernels' matmuls run
# as TF32 (10-bit mantissa operands, ~1e-3 relative; DOT_PRECISION in k3scale/ops/kda/triton.py).
TOL_BF16 = 2e-2
TOL_FP32 = 5e-3
# Training, Triton vs torch backend: same init, data and LR, bf16 autocast. Their kernels round
# differently (up to TOL_BF16 per op), and 50 steps carry those differences into the weights, so
# the losses drift apart a little: TOL_TRAIN_LOSS bounds the relative gap of the final losses
# (mean of the last LOSS_TAIL steps, and the final validation loss). Under the Triton
# interpreter on CPU the gap was 5e-5 after two steps; 1e-2 is a judgement until GPU numbers
# exist (benchmarks/README.md, "Training rows").
TOL_TRAIN_LOSS = 1e-2
LOSS_TAIL = 5
# The gpu preset trial: steps of a first call that warms up and times a step.
TRIAL_PROBE_STEPS = 3


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


@dataclass(frozen=True)
class TrainingSize:
    """The training check's run: a K3 model preset, its steps and batch (sequences)."""

    preset: str = "k3-t4"  # the smallest rung of the GPU ladders (sweeps/ladders.py)
    steps: int = 50
    seq_len: int = 1024
    batch_size: int = 16
    eval_tokens: int = 16 * 1024


@dataclass(frozen=True)
class TrainingData:
    """Where the training runs read their tokens; `note` says when it is the fallback sample."""

    dataset: str
    root: str
    note: str = ""


@dataclass(frozen=True)
class TrainedRun:
    """What one training run of the check ended with."""

    backend: str
    status: str
    losses: tuple[float, ...]
    val_loss: float
    step_ms: float
    tokens_per_s: float
    mfu: float
    peak_gib: float | None

    @property
    def tail_loss(self) -> float:
        """Mean train loss of the last LOSS_TAIL steps (less batch-to-batch noise than one)."""
        return statistics.fmean(self.losses[-LOSS_TAIL:]) if self.losses else math.nan

    @property
    def finite(self) -> bool:
        return bool(self.losses) and all(math.isfinite(x) for x in (*self.losses, self.val_loss))


def training_data(data_root: str, dataset: str, vocab_size: int, work_dir: Path) -> TrainingData:
    """`dataset` under `data_root` when it is prepared, else the committed sample prepared now
    (tokens/s and the backend comparison do not depend on which text it is)."""
    from k3scale.data import open_dataset
    from k3scale.data.sample import prepare_sample
    from k3scale.errors import K3ScaleError

    try:
        open_dataset(dataset, root=data_root)
        return TrainingData(dataset, data_root)
    except K3ScaleError:
        root = work_dir / "sample_data"
        prepare_sample(root, vocab_size=vocab_size)
        note = f"data: the committed sample ({dataset} is not prepared under {data_root})"
        return TrainingData("sample", str(root), note)


def train_once(cfg, stop_after_steps: int | None = None):
    """`train(cfg)` with the device's peak-memory counter reset first: (result, peak GiB)."""
    import torch

    from k3scale.train import train
    from k3scale.train.device import resolve_device
    from k3scale.train.perf import peak_memory_bytes

    device = resolve_device(cfg.train.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    result = train(cfg, stop_after_steps=stop_after_steps)
    peak = peak_memory_bytes(device)
    return result, (None if peak is None else peak / 2**30)


def median_step_ms(out_dir: str, batch_tokens: int, after_step: int = 0) -> float:
    """Median step time (ms) from the per-step tokens/s in the run's replica; steps up to
    `after_step` (a first call's warm-up and compilation) are left out."""
    from k3scale.track import schema
    from k3scale.track.replica import read_replica

    rates = [
        value
        for step, key, value in read_replica(Path(out_dir)).metrics
        if key == schema.METRIC_TOKENS_PER_S and step > after_step
    ]
    return 1e3 * batch_tokens / statistics.median(rates) if rates else math.nan


def run_training_check(
    device: str, backend: str, size: TrainingSize, data: TrainingData, out_dir: Path
) -> TrainedRun:
    """Train the check's K3 run (bf16 autocast, seed 0) on `device` with `model.backend`."""
    from k3scale.config import DataConfig, OptimConfig, RunConfig, ScheduleConfig, TrainConfig
    from k3scale.models.presets import get_preset

    batch_tokens = size.batch_size * size.seq_len
    cfg = RunConfig(
        model=dataclasses.replace(get_preset(size.preset), backend=backend),
        data=DataConfig(
            dataset=data.dataset, root=data.root, seq_len=size.seq_len, eval_tokens=size.eval_tokens
        ),
        optim=OptimConfig(per_head_muon=True),
        schedule=ScheduleConfig(kind="cosine", warmup_tokens=batch_tokens * (size.steps // 10)),
        train=TrainConfig(
            budget_tokens=batch_tokens * size.steps,
            batch_size=size.batch_size,
            micro_batch_size=size.batch_size,
            precision="bf16",
            device=device,
            log_interval_steps=size.steps,
            out_dir=str(out_dir),
        ),
    )
    result, peak_gib = train_once(cfg)
    return TrainedRun(
        backend=backend,
        status=result.status,
        losses=result.losses,
        val_loss=result.final_val_id_loss,
        step_ms=median_step_ms(result.out_dir, batch_tokens),
        tokens_per_s=result.tokens_per_s,
        mfu=result.mfu,
        peak_gib=peak_gib,
    )


def training_rows(reference: TrainedRun, candidate: TrainedRun, size: TrainingSize) -> list[Row]:
    """Rows of the reference (torch backend) and candidate (Triton) runs: the candidate passes
    when both are finite and its final losses are within TOL_TRAIN_LOSS of the reference's."""
    op = f"train {size.preset} {size.steps} steps"
    gap = max(
        abs(candidate.tail_loss - reference.tail_loss) / abs(reference.tail_loss),
        abs(candidate.val_loss - reference.val_loss) / abs(reference.val_loss),
    )
    rows = []
    for run in (reference, candidate):
        is_reference = run is reference
        finite = run.finite and run.status == "finished"
        error = None if is_reference else gap
        ok = finite and (is_reference or gap <= TOL_TRAIN_LOSS)
        memory = "" if run.peak_gib is None else f", peak {run.peak_gib:.1f} GiB"
        note = f"loss {run.tail_loss:.4f} (last {LOSS_TAIL}), val {run.val_loss:.4f}{memory}" + (
            "" if finite else f"; {run.status}, loss not finite"
        )
        vs_torch = None if is_reference else reference.step_ms / run.step_ms
        rate = f"{run.tokens_per_s / 1e3:,.0f}k tok/s"
        rows.append(Row(op, run.backend, run.step_ms, vs_torch, rate, run.mfu, error, ok, note))
    return rows


def check_training(size: TrainingSize, data_root: str, work_dir: Path) -> list[Row]:
    """The K3 run on the GPU under bf16 autocast: Triton backend against torch backend."""
    from k3scale.models.presets import get_preset

    vocab_size = get_preset(size.preset).vocab_size
    data = training_data(data_root, "english_mix", vocab_size, work_dir)
    torch_run = run_training_check("cuda", "torch", size, data, work_dir / "train_torch")
    triton_run = run_training_check("cuda", "triton", size, data, work_dir / "train_triton")
    rows = training_rows(torch_run, triton_run, size)
    return [dataclasses.replace(r, note=f"{r.note}; {data.note}") if data.note else r for r in rows]


def first_trial_config(study_file: str, data_root: str, work_dir: Path):
    """(RunConfig, Cell) of the first trial a study's `gpu` preset launches: its cheapest
    cell at the point that cell's seeded sampler asks for first, as the sweep driver does."""
    import optuna

    from k3scale.sweep import sources
    from k3scale.sweep.declaration import load_study
    from k3scale.sweep.planner import plan_cells, trial_config

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study(study_file)
    preset = study.preset("gpu")
    cell = plan_cells(study, preset)[0]
    sampler_study = sources.open_cell_study(None, cell, preset.seeds[0])
    params = sampler_study.ask(sources.tuning_distributions(preset)).params
    cfg = trial_config(
        study, preset, cell,
        lr=float(params["lr"]), batch_size=int(params["batch_size"]), seed=preset.seeds[0],
        out_dir=str(work_dir / "trial"), data_root=data_root, tracking_uri=None,
        dataset=preset.dataset, tags={},
    )  # fmt: skip
    return cfg, cell


def check_preset_trial(study_file: str, data_root: str, seconds: float, work_dir: Path) -> Row:
    """The first `gpu` preset trial of a study, stopped after about `seconds`: a short first call
    (warm-up, and a step time to size the rest), then a resumed call timed on its own."""
    cfg, cell = first_trial_config(study_file, data_root, work_dir)
    data = training_data(data_root, cfg.data.dataset, cfg.model.vocab_size, work_dir)
    cfg = dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, dataset=data.dataset, root=data.root)
    )
    batch_tokens = cfg.train.batch_size * cfg.data.seq_len
    started = time.perf_counter()
    probe, _ = train_once(cfg, stop_after_steps=TRIAL_PROBE_STEPS)
    # The first step compiles and warms up; the later ones time a step.
    step_s = median_step_ms(probe.out_dir, batch_tokens, after_step=1) / 1e3
    left_s = seconds - (time.perf_counter() - started)
    steps = probe.steps + max(1, int(left_s / step_s))
    result, peak_gib = train_once(cfg, stop_after_steps=steps)
    wall_s = time.perf_counter() - started
    step_ms = median_step_ms(result.out_dir, batch_tokens, after_step=probe.steps)
    finite = all(math.isfinite(x) for x in result.losses)
    ok = finite and result.status in ("stopped", "finished")
    memory = "" if peak_gib is None else f", peak {peak_gib:.1f} GiB"
    note = (
        f"{cell.key}: {result.steps} of {cfg.train.budget_tokens // batch_tokens} steps in "
        f"{wall_s:.0f} s, "
        f"lr {cfg.optim.lr:.3g}, batch {cfg.train.batch_size}x{cfg.data.seq_len}{memory}, "
        f"loss {result.losses[-1]:.3f}, train.device={cfg.train.device}"
        + ("" if finite else f"; {result.status}, loss not finite")
        + (f"; {data.note}" if data.note else "")
    )
    return Row(f"gpu trial {cell.size}", cfg.model.backend, step_ms, None,
               f"{result.tokens_per_s / 1e3:,.0f}k tok/s", result.mfu, None, ok, note)  # fmt: skip


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
    parser.add_argument(
        "--data-root", default=str(ROOT / "data_cache"),
        help="prepared datasets for the training rows (the committed sample when absent)",
    )  # fmt: skip
    parser.add_argument(
        "--trial-study", default=str(ROOT / "experiments" / "k2_vs_k3.py"),
        help="study file whose gpu preset's first trial is timed",
    )  # fmt: skip
    parser.add_argument(
        "--trial-seconds", type=float, default=None,
        help="about how long the preset trial trains (default 120, --quick 30)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.compile_only:
        return compile_only(args.arch, args.impl.split(","), not args.no_count, args.chunk)
    if (reason := no_gpu_reason()) is not None:
        print(f"gpu_check: {reason}; nothing was checked.", file=sys.stderr)
        return 2
    reps = 5 if args.quick else 20
    seq_len, situ_numel, tokens = (1024, 2**22, 2**18) if args.quick else (4096, 2**24, 2**20)
    size = TrainingSize(steps=20) if args.quick else TrainingSize()
    trial_s = args.trial_seconds or (30.0 if args.quick else 120.0)
    print(f"device: {torch.cuda.get_device_name()}")
    tflops, gbps = measure_peaks(reps)
    work = tempfile.TemporaryDirectory(prefix="gpu_check-")
    work_dir = Path(work.name)
    checks = {
        "situ_glu": lambda: check_situ(situ_numel, reps, gbps),
        "qb_counts": lambda: check_qb(tokens, 64, 256, reps, gbps),
        "kda small": check_kda_small,
        "kda": lambda: check_kda(4, seq_len, 16, 128, reps, tflops),
        "train": lambda: check_training(size, args.data_root, work_dir),
        "gpu trial": lambda: [
            check_preset_trial(args.trial_study, args.data_root, trial_s, work_dir)
        ],
    }
    rows = []
    for name, check in checks.items():
        try:
            rows.extend(check())
        except Exception as exc:  # one broken kernel must not hide the others' results
            traceback.print_exc()
            rows.append(Row(name, "triton", None, ok=False, note=f"{type(exc).__name__}: {exc}"))
        torch.cuda.empty_cache()
    work.cleanup()
    print_table(rows, tflops, gbps)
    code = 0 if all(r.ok for r in rows) else 1
    write_json(args.json, torch.cuda.get_device_name(), tflops, gbps, rows, code)
    print(f"wrote {args.json}")
    return code


if __name__ == "__main__":
    sys.exit(main())
